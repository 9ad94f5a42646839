"""Where a real host's Aqua coordinator listens when `<state_dir>/aqua.sock` is too long for AF_UNIX.

`make run` passes `<checkout>/var/agents/local`: under a checkout path of about 80 characters the
socket path passes the kernel's limit. The coordinator then listens in a short, private runtime
directory, `<runtime>/gpu-agent-<uid>/aqua-<hash of the state dir>.sock`, and the agent runs with
lending as usual.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_agent.aqua import AquaHost
from gpu_agent.aqua_socket import UNIX_PATH_MAX, coordinator_socket
from gpu_agent.engines import VllmLauncher
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory

coordinator = pytest.importorskip("serving.aqua.coordinator", reason="serving.aqua.coordinator not present")


def short_dir() -> str:
    """A fresh directory whose path is short, whatever pytest's tmp_path is."""
    return tempfile.mkdtemp(prefix="aq", dir="/tmp")  # a short path, whatever $TMPDIR is


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """$XDG_RUNTIME_DIR, and a system temp dir of its own, both short and removed afterwards."""
    xdg, temp = short_dir(), short_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    monkeypatch.setattr(tempfile, "tempdir", temp)
    try:
        yield xdg
    finally:
        shutil.rmtree(xdg)
        shutil.rmtree(temp)


def long_state_dir(tmp_path: Path, name: str = "state") -> Path:
    state = tmp_path / ("d" * UNIX_PATH_MAX) / name
    assert len(os.fsencode(state / "aqua.sock")) > UNIX_PATH_MAX
    return state


def expected_socket(base: str, state: Path) -> str:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(state))).hexdigest()[:12]
    return os.path.join(base, f"gpu-agent-{os.geteuid()}", f"aqua-{digest}.sock")


def ping(path: str) -> None:
    with coordinator.AquaClient(path, name="test", connect_timeout=2.0) as client:
        client.ping()


@pytest.mark.asyncio
async def test_it_runs_the_coordinator_in_a_private_runtime_dir_when_the_state_dir_path_is_too_long(
    tmp_path: Path, runtime: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = long_state_dir(tmp_path)
    state.mkdir(parents=True)
    caplog.set_level(logging.WARNING, logger="gpu_agent.aqua")
    host = LocalHost(CpuInventory(), str(state))
    await host.start(lambda status: None)
    try:
        assert host.aqua is not None
        path = expected_socket(runtime, state)
        assert host.aqua.socket_path == path
        ping(path)  # the coordinator answers there
        launcher = host.engines._launcher  # type: ignore[union-attr]
        assert isinstance(launcher, VllmLauncher) and launcher.aqua_socket == path  # engines get it
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not (state / "aqua.sock").exists()
    finally:
        await host.stop()
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert repr(str(state / "aqua.sock")) in warning.getMessage() and repr(path) in warning.getMessage()


def test_one_state_dir_gets_the_same_socket_on_every_start_and_another_a_different_one(
    tmp_path: Path, runtime: str
) -> None:
    state = long_state_dir(tmp_path)
    paths = []
    for _ in range(2):  # two agent starts with the same state dir
        host = AquaHost.for_state_dir(str(state))
        assert host.start() is True
        try:
            ping(host.requested_socket)
        finally:
            host.stop()
        paths.append(host.requested_socket)
    assert paths[0] == paths[1] == expected_socket(runtime, state)
    other, _ = coordinator_socket(str(long_state_dir(tmp_path, "other")))
    assert other != paths[0] and os.path.dirname(other) == os.path.dirname(paths[0])


def test_the_private_dir_is_made_again_0700_should_a_temp_cleaner_remove_it(
    tmp_path: Path, runtime: str
) -> None:
    host = AquaHost.for_state_dir(str(long_state_dir(tmp_path)))
    path = host.requested_socket
    old_umask = os.umask(0)  # what an os.makedirs would leave open to everyone
    try:
        assert host.start() is True
        shutil.rmtree(os.path.dirname(path))  # socket and directory gone
        host.refresh()  # the next telemetry tick restarts it
        assert host.restarts == 1
        ping(path)
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    finally:
        os.umask(old_umask)
        host.stop()


@pytest.mark.parametrize("xdg", [None, "", "relative/run", "/nonexistent/run"])
def test_without_a_usable_xdg_runtime_dir_it_uses_the_system_temp_dir(
    tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch, xdg: str | None
) -> None:
    if xdg is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR")
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    state = long_state_dir(tmp_path)
    assert coordinator_socket(str(state)) == (expected_socket(tempfile.gettempdir(), state), True)


def test_it_does_not_use_a_gpu_agent_dir_others_can_enter_or_a_symlink(tmp_path: Path, runtime: str) -> None:
    state = long_state_dir(tmp_path)
    squatted = Path(runtime, f"gpu-agent-{os.geteuid()}")
    squatted.mkdir(mode=0o755)
    squatted.chmod(0o755)
    assert coordinator_socket(str(state)) == (expected_socket(tempfile.gettempdir(), state), True)
    squatted.rmdir()
    target = Path(runtime, "elsewhere")
    target.mkdir(mode=0o700)
    squatted.symlink_to(target)
    assert coordinator_socket(str(state)) == (expected_socket(tempfile.gettempdir(), state), True)


def test_a_state_dir_whose_socket_path_fits_keeps_it(tmp_path: Path, runtime: str) -> None:
    state = tmp_path / "state"
    assert coordinator_socket(str(state)) == (str(state / "aqua.sock"), False)
    host = LocalHost(CpuInventory(), str(state))
    assert host.aqua is not None and host.aqua.requested_socket == str(state / "aqua.sock")
    assert not os.listdir(runtime)  # no runtime dir made
