"""`python -m gpu_agent`: run this host's agent (or a simulated host) against a control plane."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Sequence
from typing import IO

from gpu_agent.agent import Agent
from gpu_agent.config import (
    AgentConfig,
    fallback_address_warning,
    load_config_file,
    plaintext_token_warning,
    sim_gpu_kinds,
)
from gpu_agent.host import Host
from gpu_agent.link import redacted_url

log = logging.getLogger("gpu_agent")
STATE_LOCK = "agent.lock"  # in the state dir: held (flock) by the one agent that uses it
_state_locks: list[IO[str]] = []  # kept open while their agent runs: closing one unlocks it


def build_parser() -> argparse.ArgumentParser:
    kinds = ", ".join(sim_gpu_kinds())
    p = argparse.ArgumentParser(
        prog="python -m gpu_agent",
        description="GPU host agent: inventory, vLLM engines, Aqua coordinator, control-plane link.",
    )
    p.add_argument("--config", help="YAML file with any of the options below (flags override it)")
    p.add_argument("--control-plane", help="control plane base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--token", help="host token (default: $GPU_AGENT_TOKEN)")
    p.add_argument("--simulate", help=f"run a simulated host, COUNTxKIND, e.g. 8xH100 (kinds: {kinds})")
    for f in dataclasses.fields(AgentConfig):
        if f.name in ("control_plane", "token", "simulate"):
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, help=f.metadata.get("help"))
    return p


def make_config(argv: Sequence[str] | None) -> AgentConfig:
    """Parse the command line (and config file) into a validated config; ValueError if bad."""
    return _make_config(argv)[0]


def _make_config(argv: Sequence[str] | None) -> tuple[AgentConfig, bool]:
    """`make_config`'s config, and whether --address was given (flag or file)."""
    args = build_parser().parse_args(argv)
    if args.config is not None:  # (--config=~/agent.yaml: no shell expands a '~' after '=')
        args.config = os.path.expanduser(args.config)
    file_values = load_config_file(args.config) if args.config is not None else {}
    overrides = {k: v for k, v in vars(args).items() if k != "config"}
    if overrides.get("token") is None and file_values.get("token") is None:
        overrides["token"] = os.environ.get("GPU_AGENT_TOKEN")
    address_given = overrides.get("address") is not None or file_values.get("address") is not None
    try:
        return AgentConfig.build(file_values, overrides), address_given
    except ValueError as exc:
        key = _key_named(str(exc))
        from_file = key is not None and file_values.get(key) is not None and overrides.get(key) is None
        if args.config is not None and (from_file or str(exc).startswith("unknown config key")):
            raise ValueError(f"config file {args.config!r}: {exc}") from None
        if key is not None and getattr(args, key, None) is not None:  # a flag the user typed
            raise ValueError(_as_flag(key, str(exc))) from None
        raise


def _as_flag(key: str, message: str) -> str:
    """``message`` naming ``key`` as its flag: "sim_rate=nan must ..." -> "--sim-rate=nan must ..."."""
    if re.match(rf"{key}(?:=| holds)", message):
        return f"--{key.replace('_', '-')}{message[len(key) :]}"
    return message


def _key_named(message: str) -> str | None:
    """The config key an AgentConfig error is about: "config key 'k' must be ...", "k=... must",
    "k holds ...", "--simulate ...", "control plane URL ..."; None if none is."""
    if message.startswith("control plane URL"):
        return "control_plane"
    if message.startswith("--simulate"):
        return "simulate"
    match = re.match(r"config key '(\w+)'|(\w+)(?:=| holds| is required)", message)
    return None if match is None else match.group(1) or match.group(2)


def make_host(cfg: AgentConfig) -> Host:
    if cfg.simulate is not None:
        from gpu_agent.simulated import SimulatedHost

        return SimulatedHost(
            cfg.simulate, model=cfg.sim_model, rate=cfg.sim_rate, seed=cfg.sim_seed, name=cfg.name
        )
    from gpu_agent.engines.liveness import Liveness
    from gpu_agent.host import LocalHost
    from gpu_agent.inventory import detect_inventory

    check_engine_bind(cfg)
    try:  # now, not from inside the running agent
        os.makedirs(cfg.state_dir, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--state-dir {cfg.state_dir!r}: cannot create it ({exc.strerror})") from None
    _state_locks.append(claim_state_dir(cfg.state_dir))
    return LocalHost(
        detect_inventory(agent_name=cfg.name),
        cfg.state_dir,
        engine_bind=cfg.engine_bind or "127.0.0.1",
        health_timeout_s=cfg.health_timeout_s,
        liveness=Liveness(cfg.liveness_interval_s, cfg.liveness_timeout_s, cfg.liveness_failures),
        readings_max_age_s=cfg.readings_max_age_s,
    )


def check_engine_bind(cfg: AgentConfig) -> None:
    """ValueError naming `--engine-bind` when engines could not listen on it (an address of no
    interface of this machine: a NAT'd or public address given as `--address`, which engines bind
    by default); otherwise every engine failed to bind its port, and was restarted for ever."""
    host = cfg.engine_bind or "127.0.0.1"
    try:  # as the engine's server binds it: the first address the name resolves to
        family, _, _, _, where = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(where)
    except OSError as exc:  # (socket.gaierror too: a name that does not resolve)
        default = " (the default: --address)" if host == cfg.address else ""
        raise ValueError(
            f"--engine-bind {host!r}{default}: engines cannot listen there ({exc.strerror}); give"
            " --engine-bind 0.0.0.0 (every interface) or an address of this machine"
        ) from None


def claim_state_dir(state_dir: str) -> IO[str]:
    """Lock `state_dir` for this process (released when it exits, however it exits), or
    ValueError naming the agent that holds it: two agents on one state dir share its Aqua socket
    (the second one's engines lend through the first's coordinator) and its engine logs."""
    path = os.path.join(state_dir, STATE_LOCK)
    try:
        lock = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held open on purpose)
    except OSError as exc:
        raise ValueError(f"--state-dir {state_dir!r}: cannot open {path} ({exc.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # EWOULDBLOCK: another open file holds the lock
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise ValueError(
            f"--state-dir {state_dir!r} is in use by another agent (pid {holder}); two agents on one"
            " machine need different state dirs"
        ) from None
    except OSError as exc:  # no flock there (ENOLCK, EOPNOTSUPP on some network filesystems)
        lock.close()
        raise ValueError(
            f"--state-dir {state_dir!r}: cannot lock {path} ({exc.strerror}); use a state dir on a local"
            " filesystem"
        ) from None
    with contextlib.suppress(OSError):
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
    return lock


async def _serve(agent: Agent) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg, address_given = _make_config(argv)
    except ValueError as exc:
        print(f"python -m gpu_agent: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for warning in (plaintext_token_warning(cfg.control_plane), fallback_address_warning(cfg, address_given)):
        if warning is not None:
            log.warning("%s", warning)
    held = len(_state_locks)
    try:
        host = make_host(cfg)
    except ValueError as exc:
        print(f"python -m gpu_agent: error: {exc}", file=sys.stderr)
        return 2
    try:
        _run_agent(cfg, host)
    finally:  # the agent has stopped: its state dir is free (for another agent of this process too)
        while len(_state_locks) > held:
            _state_locks.pop().close()
    return 0


def _run_agent(cfg: AgentConfig, host: Host) -> None:
    agent = Agent(
        host,
        cfg.control_plane,
        cfg.token,
        name=cfg.name,
        address=cfg.address,
        telemetry_interval_s=cfg.telemetry_interval_s,
        buffer_size=cfg.buffer_size,
    )
    what = f"simulated {cfg.simulate} host" if cfg.simulate else "host"
    log.info(
        "Agent for %s %r (%s) connecting to %s.", what, cfg.name, cfg.address, redacted_url(agent.link.url)
    )
    asyncio.run(_serve(agent))
