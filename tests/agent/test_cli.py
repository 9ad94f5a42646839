"""The command line: validation messages, config files, and a real agent process."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_agent.cli import claim_state_dir, main, make_config
from gpu_agent.config import parse_simulate_spec
from gpu_agent.engines.command import REPO_ROOT
from tests.agent.ws_server import ControlPlaneStub, wait_for


def test_it_rejects_an_unknown_gpu_kind_listing_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--simulate", "8xQ100", "--control-plane", "http://cp", "--token", "t"]) == 2
    err = capsys.readouterr().err
    assert "'8xQ100'" in err and "A100, H100, H200" in err


@pytest.mark.parametrize(
    ("value", "message"),
    [("eightxH100", "COUNTxKIND"), ("0xH100", "1..16"), ("17xH200", "1..16"), ("8-H100", "COUNTxKIND")],
)
def test_it_rejects_malformed_simulate_specs(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_simulate_spec(value)
    assert repr(value) in str(err.value)


def test_it_accepts_simulate_specs_case_insensitively() -> None:
    assert parse_simulate_spec("8xH100") == (8, "H100")
    assert parse_simulate_spec("4Xa100") == (4, "A100")


def test_it_requires_a_token_and_a_valid_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPU_AGENT_TOKEN", raising=False)
    assert main(["--control-plane", "http://cp"]) == 2
    assert "token is required" in capsys.readouterr().err
    assert main(["--control-plane", "ftp://cp", "--token", "t"]) == 2
    assert "'ftp://cp'" in capsys.readouterr().err
    monkeypatch.setenv("GPU_AGENT_TOKEN", "from-env")
    assert make_config(["--control-plane", "http://cp"]).token == "from-env"


def test_it_reads_a_config_file_that_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control-plane: http://cp:8000\ntoken: file-token\nname: box-1\nbuffer_size: 10\n")
    cfg = make_config(["--config", str(path), "--name", "box-2"])
    assert (cfg.control_plane, cfg.token, cfg.name, cfg.buffer_size) == (
        "http://cp:8000",
        "file-token",
        "box-2",
        10,
    )
    path.write_text("control_plane: http://cp\ntoken: t\ncolour: red\n")
    with pytest.raises(ValueError, match="unknown config key 'colour'"):
        make_config(["--config", str(path)])
    path.write_text("control_plane: http://cp\ntoken: t\nbuffer_size: lots\n")
    with pytest.raises(ValueError, match="'buffer_size'"):
        make_config(["--config", str(path)])
    with pytest.raises(ValueError, match="cannot read config file"):
        make_config(["--config", str(tmp_path / "missing.yaml")])


@pytest.mark.asyncio
async def test_it_runs_as_a_process_and_stops_on_sigterm(tmp_path: Path) -> None:
    server = ControlPlaneStub()
    await server.start()
    env = {**os.environ, "GPU_AGENT_TOKEN": "good-token", "PYTHONPATH": REPO_ROOT}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_agent", "--control-plane", server.url, "--name", "proc-box",
        "--state-dir", str(tmp_path / "state"), cwd=REPO_ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_for(lambda: len(server.of_type("telemetry")) >= 2, timeout=30)
        assert server.of_type("register")[0]["host"] == "proc-box"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
        await server.stop()
    assert proc.returncode == 0, out.decode()
    assert b"No NVIDIA driver" in out


def test_it_binds_engines_where_the_control_plane_will_reach_them() -> None:
    base = ["--control-plane", "http://cp", "--token", "t"]
    assert make_config([*base, "--address", "10.1.2.3"]).engine_bind == "10.1.2.3"
    assert make_config([*base, "--address", "agent"]).engine_bind == "0.0.0.0"
    assert make_config([*base, "--address", "agent", "--engine-bind", "127.0.0.1"]).engine_bind == "127.0.0.1"


@pytest.mark.asyncio
async def test_a_second_agent_on_the_same_state_dir_is_refused_and_the_first_keeps_running(
    tmp_path: Path,
) -> None:
    # It would share the first one's Aqua socket (its engines lending through the first's
    # coordinator) and engine logs.
    server = ControlPlaneStub()
    await server.start()
    env = {**os.environ, "GPU_AGENT_TOKEN": "good-token", "PYTHONPATH": REPO_ROOT}
    state = str(tmp_path / "state")

    async def agent(name: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpu_agent", "--control-plane", server.url, "--name", name,
            "--state-dir", state, cwd=REPO_ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip

    first = await agent("box-1")
    second: asyncio.subprocess.Process | None = None
    try:
        await wait_for(lambda: len(server.of_type("register")) == 1, timeout=30)
        second = await agent("box-2")
        out, _ = await asyncio.wait_for(second.communicate(), 20)
        assert second.returncode == 2, out.decode()
        assert f"--state-dir {state!r} is in use by another agent (pid {first.pid})" in out.decode()
        assert first.returncode is None and [r["host"] for r in server.of_type("register")] == ["box-1"]
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(proc.communicate(), 20)
        await server.stop()
    assert first.returncode == 0
    # Its lock went with it: the state dir is free for the next agent.
    claim_state_dir(state).close()


def test_a_state_dir_that_cannot_be_locked_is_not_said_to_be_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filesystem without flock (ENOLCK): it used to say "in use by another agent (pid unknown)".
    def no_locks(fd: object, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr("gpu_agent.cli.fcntl.flock", no_locks)
    state = str(tmp_path)
    with pytest.raises(ValueError) as err:
        claim_state_dir(state)
    lock = os.path.join(state, "agent.lock")
    assert str(err.value).startswith(f"--state-dir {state!r}: cannot lock {lock}")
    assert os.strerror(errno.ENOLCK) in str(err.value) and "in use" not in str(err.value)


class ReturningAgent:
    """Stands in for `Agent`: runs and stops at once, closing its host's inventory."""

    def __init__(self, host: Any, *args: object, **kwargs: object) -> None:
        self.host = host
        self.link = SimpleNamespace(url="ws://cp/agent")

    async def run(self) -> None:
        self.host.inventory.close()

    def stop(self) -> None:
        return None


def test_an_agent_that_stopped_leaves_its_state_dir_to_the_next_one_of_the_same_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its lock was kept for the life of the process: a second main() there exited 2, "in use by
    # another agent" with this process's own pid.
    monkeypatch.setattr("gpu_agent.cli.Agent", ReturningAgent)
    args = ["--control-plane", "http://cp", "--token", "t", "--state-dir", str(tmp_path / "state")]
    assert main(args) == 0
    assert main(args) == 0, capsys.readouterr().err
    claim_state_dir(str(tmp_path / "state")).close()
