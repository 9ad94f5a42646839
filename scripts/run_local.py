#!/usr/bin/env python
"""`make run`: the whole platform on one machine, as a small process supervisor.

Prepares the database (migrate, first admin user) and the agents' hosts, then starts every
process in ``process_specs`` (the ASGI server, a Celery worker with embedded beat on the filesystem
broker, local GPU agents) and watches them. A set-up command that fails stops the run before
anything starts, with its output and a line naming it (exit status 1). Ctrl-C (SIGINT) or SIGTERM
stops them all: each child runs in its own process group, gets SIGTERM, and whatever is left after
a grace period gets SIGKILL. If one child dies on its own, the others are stopped too and the exit
status is non-zero.

Environment: HOST / PORT (default 127.0.0.1:8000), CELERY_CONCURRENCY (default 2), plus every
setting config/settings.py reads (DATABASE_URL, REDIS_URL, ...). A local GPU agent always runs
(serving the tiny model when vLLM's CPU build is installed) unless LOCAL_AGENT=0; SIMULATE=1 adds
a simulated 8xH100 host (`make run SIMULATE=1`), SIMULATE=<COUNT>x<GPU> (e.g. 4xA100) one of those.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/run_local.py`: sys.path[0] is scripts/
    sys.path.insert(0, str(ROOT))

from gpu_agent.address import host_address  # noqa: E402
from gpu_agent.config import parse_simulate_spec  # noqa: E402

GRACE_S = 10.0
# The most Celery worker processes: the prefork pool starts them all at once, each a whole Django
# process (about 150 MB resident); 10**30 was accepted and passed to Celery as --concurrency.
MAX_WORKER_CONCURRENCY = 64


@dataclass(frozen=True)
class ProcessSpec:
    """One supervised process: ``name`` prefixes its output lines."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunConfig:
    host: str
    port: int
    worker_concurrency: int


def base_env() -> dict[str, str]:
    """The environment every child gets: platform/ and the repo root importable, our settings."""
    env = dict(os.environ)
    paths = [str(ROOT / "platform"), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def var_dir(env: dict[str, str] | None = None) -> Path:
    """Where run-time state goes (settings' VAR_DIR)."""
    return Path((os.environ if env is None else env).get("VAR_DIR") or ROOT / "var")


def process_specs(config: RunConfig) -> list[ProcessSpec]:
    """The processes `make run` starts, in start order. Add new long-running processes here."""
    python = sys.executable
    return [
        ProcessSpec(
            "web",
            [python, "-m", "daphne", "-b", config.host, "-p", str(config.port), "config.asgi:application"],
        ),
        ProcessSpec(
            "worker",
            [
                python,
                "-m",
                "celery",
                "-A",
                "config.celery",
                "worker",
                "--loglevel=INFO",
                f"--concurrency={config.worker_concurrency}",
                "--without-gossip",
                "--without-mingle",
                # Embedded beat: the periodic tasks of settings.CELERY_BEAT_SCHEDULE (lost jobs).
                "--beat",
                f"--schedule={var_dir() / 'celerybeat-schedule'}",
            ],
        ),
    ]


class SetupFailed(Exception):
    """A set-up command (run before any process starts) failed; the message names it."""


def setup_command(argv: list[str], env: dict[str, str], *, capture: bool = False) -> str:
    """Run one set-up command to completion. With ``capture``, returns its stdout and relays its
    stderr (notes for the operator) as ``[run]`` lines; without, both go straight to the terminal.

    Raises:
        SetupFailed: it exited non-zero; what it wrote, if captured, is printed first."""
    # Bytes, decoded here: text mode would turn each "\r" of a progress bar into a line end.
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=capture)
    stdout, stderr = (b.decode(errors="replace") if b else "" for b in (result.stdout, result.stderr))
    if result.returncode != 0:
        if capture:
            for name, text in (("stdout", stdout), ("stderr", stderr)):
                if text.strip():
                    print(
                        f"[run] {name} of the failed command:\n{text.rstrip()}", file=sys.stderr, flush=True
                    )
        raise SetupFailed(f"`{command_line(argv)}` exited with status {result.returncode}")
    if not capture:
        return ""
    for line in stderr.replace("\r\n", "\n").split("\n"):
        # A progress bar redraws its line after each "\r": only its last drawing is a note, and
        # blank lines are none.
        note = line.rsplit("\r", 1)[-1].rstrip()
        if note.strip():
            print(f"[run] {note}", flush=True)
    return stdout.replace("\r\n", "\n")


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as a shell line, for a message: the interpreter left out, a script under the
    repository root relative to it ("manage.py local_agent local")."""
    shown = list(argv[1:]) if argv and argv[0] == sys.executable else list(argv)
    if shown and Path(shown[0]).is_relative_to(ROOT):
        shown[0] = str(Path(shown[0]).relative_to(ROOT))
    return shlex.join(shown)


def prepare(env: dict[str, str]) -> None:
    """Apply migrations and create the first admin user (its password is printed once)."""
    manage = [sys.executable, str(ROOT / "manage.py")]
    setup_command([*manage, "migrate", "--noinput"], env)
    setup_command([*manage, "bootstrap_admin"], env)


def agent_specs(config: RunConfig, env: dict[str, str]) -> list[ProcessSpec]:
    """One local agent (serving the tiny model on vLLM's CPU build when it is installed; none with
    LOCAL_AGENT=0) and, with SIMULATE=1 (or SIMULATE=<COUNT>x<GPU>, e.g. 4xA100), one simulated
    host, whatever LOCAL_AGENT says. Each gets a host and a fresh token from
    `manage.py local_agent`, passed in the environment (not on argv)."""
    off = ("0", "false", "no", "off")
    manage = [sys.executable, str(ROOT / "manage.py"), "local_agent"]
    url = base_url(config)
    state = var_dir(env)
    local = ["local"]
    with_local = env.get("LOCAL_AGENT", "1").strip().lower() not in off
    has_vllm = importlib.util.find_spec("vllm") is not None
    if with_local and has_vllm:
        build = [sys.executable, str(ROOT / "scripts" / "build_tiny_model.py")]
        built = setup_command([*build, "--out", str(state / "models" / "tiny-llama")], env, capture=True)
        local += ["--tiny-model", built.strip().splitlines()[-1]]
    elif with_local:
        print("[run] vLLM's CPU build is not installed (make venv-vllm): the local agent serves no model")

    def agent(name: str, prepare_args: list[str], extra: list[str]) -> ProcessSpec:
        token = setup_command([*manage, *prepare_args], env, capture=True).strip()
        argv = [sys.executable, "-m", "gpu_agent", "--control-plane", url, "--name", prepare_args[0]]
        argv += ["--address", "127.0.0.1", "--state-dir", str(state / "agents" / prepare_args[0]), *extra]
        return ProcessSpec(name, argv, {"GPU_AGENT_TOKEN": token})

    specs = [agent("agent", local, [])] if with_local else []
    kind = simulate_kind(env.get("SIMULATE"))
    if kind is not None:
        specs.append(agent("sim", [f"sim-{kind.lower()}", "--simulated"], ["--simulate", kind]))
    return specs


def simulate_kind(value: str | None) -> str | None:
    """The simulated host SIMULATE asks for, as COUNTxKIND (1/true/yes/on: 8xH100); None when
    off. Normalised ("8 x h100" -> "8xH100"): it also names the host (sim-8xh100), which may hold
    no spaces. Raises ValueError (gpu_agent's message) for a spec the agent would refuse."""
    simulate = (value or "").strip()
    if not simulate or simulate.lower() in ("0", "false", "no", "off"):
        return None
    count, kind = parse_simulate_spec(
        "8xH100" if simulate.lower() in ("1", "true", "yes", "on") else simulate
    )
    return f"{count}x{kind}"


class Supervisor:
    """Starts processes, relays their output, stops all of them when one stops or on a signal."""

    def __init__(self, specs: Sequence[ProcessSpec], env: dict[str, str]) -> None:
        self.specs = list(specs)
        self.env = env
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()

    def start(self, specs: Sequence[ProcessSpec] | None = None) -> None:
        """Start ``specs`` (default: every spec), each of the supervisor's own specs."""
        for spec in self.specs if specs is None else specs:
            child = subprocess.Popen(
                spec.argv,
                cwd=ROOT,
                env={**self.env, **spec.env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: we decide when and how it stops
            )
            self.children[spec.name] = child
            threading.Thread(target=self._relay, args=(spec.name, child), daemon=True).start()
            print(f"[run] started {spec.name} (pid {child.pid})", flush=True)

    def _relay(self, name: str, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for raw in iter(child.stdout.readline, b""):
            sys.stdout.write(f"{name:>7} | {raw.decode(errors='replace')}")
            sys.stdout.flush()

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        """No stop was requested and every child is alive."""
        return not self._stop.is_set() and all(c.poll() is None for c in self.children.values())

    def wait(self) -> int:
        """Block until a signal or a child's exit; then stop everything. Returns the exit status."""
        status = 0
        while not self._stop.is_set():
            for name, child in self.children.items():
                code = child.poll()
                if code is not None:
                    print(f"[run] {name} exited with status {code}; stopping the rest", flush=True)
                    status = code or 1
                    self._stop.set()
                    break
            self._stop.wait(0.5)
        self.stop_all()
        return status

    def stop_all(self) -> None:
        for name, child in reversed(list(self.children.items())):
            if child.poll() is None:
                print(f"[run] stopping {name}", flush=True)
                # The leader only: it shuts its own children down (Celery's pool) in order.
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for child in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
        for name, child in self.children.items():
            # Kill the whole group even if the leader exited: pool workers may linger.
            if child.poll() is None:
                print(f"[run] {name} ignored SIGTERM for {GRACE_S:.0f}s; killing", flush=True)
            _signal_group(child, signal.SIGKILL)
            child.wait()
        print("[run] all processes stopped", flush=True)


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signum)


def wait_healthy(url: str, timeout_s: float, supervisor: Supervisor) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and supervisor.running:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    """The run's config from flags, else the environment (HOST, PORT, CELERY_CONCURRENCY), else
    defaults. A bad value, in either, is an argparse error (exit 2) naming the flag or variable."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default=None, help="address to serve on (default $HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="TCP port (default $PORT or 8000)")
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=None,
        help="Celery worker processes (default $CELERY_CONCURRENCY or 2)",
    )
    args = parser.parse_args(argv)
    host = args.host if args.host is not None else os.environ.get("HOST", "127.0.0.1")
    try:  # daphne binds it and the agents connect to it: no port, URL or stray text in it
        host = host_address(host, unspecified_ok=True)  # "[::1]" -> "::1", as daphne -b takes it
    except ValueError as error:
        where = "argument --host" if args.host is not None else "environment variable HOST="
        parser.error(f"{where}{'' if args.host is None else ': '}{error}")
    try:  # else its host row and token were made, and then its agent refused the spec (exit 2)
        simulate_kind(os.environ.get("SIMULATE"))
    except ValueError as error:
        parser.error(f"environment variable SIMULATE={os.environ['SIMULATE']!r}: {error}")
    port, port_given = _int_option(parser, args.port, "--port", "PORT", 8000)
    workers, workers_given = _int_option(
        parser, args.worker_concurrency, "--worker-concurrency", "CELERY_CONCURRENCY", 2
    )
    if not 0 < port < 65536:
        parser.error(f"{port_given} is not a TCP port (1..65535)")
    if workers < 1:
        parser.error(f"{workers_given} must be >= 1")
    if workers > MAX_WORKER_CONCURRENCY:
        parser.error(f"{workers_given} must be at most {MAX_WORKER_CONCURRENCY} (each is a Django process)")
    return RunConfig(host=host, port=port, worker_concurrency=workers)


def _int_option(
    parser: argparse.ArgumentParser, given: int | None, flag: str, variable: str, default: int
) -> tuple[int, str]:
    """The flag's value, else the environment variable's as an integer, else ``default``; with
    where it came from, for a message ("--port 0", "PORT='0'")."""
    if given is not None:
        return given, f"{flag} {given}"
    raw = os.environ.get(variable)
    if raw is None:
        return default, f"{flag} {default}"
    try:
        return int(raw), f"environment variable {variable}={raw!r}"
    except ValueError:
        parser.error(f"environment variable {variable}={raw!r} is not an integer")


def base_url(config: RunConfig) -> str:
    """Where the agents (and the operator) reach the server: an unspecified bind address
    (0.0.0.0, ::) is reached on 127.0.0.1; an IPv6 address is bracketed."""
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    return f"http://{f'[{host}]' if ':' in host else host}:{config.port}"


def port_in_use(config: RunConfig) -> bool:
    """Whether something listens on the address the web server is to bind (another `make run`).
    SO_REUSEADDR, as daphne binds: a port left in TIME_WAIT by a run just stopped is free."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            config.host, config.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError:
        return False  # daphne says what is wrong with the address
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    env = base_env()
    # Checked before the set-up: it rotates the local agents' tokens, which would cut off the agents
    # of a run already serving there, and that run's health check would pass for this one's.
    if port_in_use(config):
        print(
            f"[run] {base_url(config)} is in use (another `make run`?); nothing was set up or started: "
            "stop that server, or set PORT (or --port) to a free port",
            file=sys.stderr,
            flush=True,
        )
        return 1
    try:
        prepare(env)
        services, agents = process_specs(config), agent_specs(config, env)
    except SetupFailed as error:
        print(f"[run] set-up failed, nothing was started: {error}", file=sys.stderr, flush=True)
        return 1
    supervisor = Supervisor([*services, *agents], env)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    supervisor.start(services)
    base = base_url(config)
    healthy = wait_healthy(f"{base}/api/health/", 60.0, supervisor)
    # Agents once the web server answers: one started beside it logged its link "down (Connection
    # refused)" as warnings at every start. They retry on their own if it never does.
    if supervisor.running:
        supervisor.start(agents)
    if healthy:
        print(
            f"[run] ready: API {base}/api/v1/  Swagger UI {base}/api/docs/  login {base}/accounts/login/\n"
            f"[run] token: curl -X POST {base}/api/v1/auth/token/ -H 'Content-Type: application/json' "
            '-d \'{"username": "admin", "password": "..."}\'\n'
            "[run] Ctrl-C stops everything.",
            flush=True,
        )
    return supervisor.wait()


if __name__ == "__main__":
    sys.exit(main())
