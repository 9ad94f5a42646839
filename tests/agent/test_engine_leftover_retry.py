"""An engine group a killed agent left that survives the next agent's start (its SIGKILL did not
end it) is tried again while the agent runs, and no engine starts on its devices until it is gone."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpu_agent.engines.leftovers as leftovers
import gpu_agent.engines.manager as manager_module
from gpu_agent.agent import Agent
from gpu_agent.engines import EngineManager
from gpu_agent.engines.leftovers import start_time
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory
from gpu_agent.protocol import DeploymentStatus
from tests.agent.test_engine_survivor_port import retry_until_started
from tests.agent.test_engines import alive, fake_launcher, spec
from tests.agent.ws_server import wait_for

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"  # noqa: E501


class SigkillFails:
    """`leftovers.signal_group` that drops SIGKILL while `failing` (a group it cannot end: stuck in
    the kernel, say); every other signal goes to the real group."""

    def __init__(self) -> None:
        self.failing = True
        self.real = leftovers.signal_group

    def __call__(self, pgid: int, sig: signal.Signals) -> None:
        if not (self.failing and sig == signal.SIGKILL):
            self.real(pgid, sig)


@pytest.fixture
def sigkill(monkeypatch: pytest.MonkeyPatch) -> SigkillFails:
    fails = SigkillFails()
    monkeypatch.setattr(leftovers, "signal_group", fails)
    monkeypatch.setattr(leftovers, "KILL_WAIT_S", 0.3)
    return fails


@pytest.fixture
def left_group(tmp_path: Path) -> Iterator[int]:
    """A real engine group (its own session, ignoring SIGTERM) recorded on device 0 by an agent
    that was killed; its pgid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        (tmp_path / "logs").mkdir()
        record = {"pgid": proc.pid, "start": start_time(proc.pid), "deployment": "old", "devices": [0]}
        (tmp_path / "logs" / f"old.{proc.pid}.group").write_text(json.dumps(record))
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def records(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "logs").glob("*.group"))


@pytest.mark.asyncio
async def test_a_group_that_survives_the_agents_start_is_ended_by_a_later_periodic_try(
    tmp_path: Path,
    left_group: int,
    sigkill: SigkillFails,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(manager_module, "LEFTOVER_RETRY_S", 0.2, raising=False)
    host = LocalHost(
        CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=0.2, with_aqua=False
    )
    agent = Agent(
        host, "http://127.0.0.1:9", "token", name="box", address="127.0.0.1", telemetry_interval_s=0.1
    )
    task = asyncio.create_task(agent.run())
    try:
        with caplog.at_level(logging.WARNING):
            await wait_for(lambda: any("after SIGKILL" in r.getMessage() for r in caplog.records), timeout=10)
            assert alive(left_group)  # the start's SIGKILL did not end it
            assert records(tmp_path) == [f"old.{left_group}.group"]
            await asyncio.sleep(0.5)  # ticks try again: it survives those too
            assert alive(left_group) and records(tmp_path) == [f"old.{left_group}.group"]
            sigkill.failing = False
            await wait_for(lambda: not alive(left_group), timeout=10)
        await wait_for(lambda: records(tmp_path) == [])
        # The try's thread removes the record; the manager forgets the group once that try returns.
        engines = host.engines
        assert engines is not None
        await wait_for(lambda: engines.leftovers() == [])
        assert any(f"process group {left_group} of deployment old" in r.getMessage() for r in caplog.records)
        assert any(r.getMessage().endswith("is gone.") for r in caplog.records)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)


@pytest.mark.asyncio
async def test_no_engine_starts_on_a_device_a_surviving_group_holds_until_it_is_gone(
    tmp_path: Path, left_group: int, sigkill: SigkillFails, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "LEFTOVER_RETRY_S", 0.1, raising=False)
    statuses: list[DeploymentStatus] = []
    logs, launcher = str(tmp_path / "logs"), fake_launcher(tmp_path / "pids")
    manager = EngineManager(launcher, logs, statuses.append, devices={0, 1}, grace_s=0.2)
    try:
        assert await manager.end_leftovers() == 1
        assert alive(left_group)
        await manager.apply([spec("on0", [0])])
        assert manager.supervisor("on0") is None  # postponed: it would fail for lack of memory
        await manager.apply([spec("on0", [0]), spec("on1", [1])])
        assert manager.supervisor("on0") is None
        on1 = manager.supervisor("on1")
        assert on1 is not None  # device 1 is free
        failed = [s for s in statuses if s.deployment_id == "on0"][-1]
        assert failed.state == "failed" and failed.error is not None
        assert f"process group {left_group} of deployment old on device(s) [0]" in failed.error
        assert [s.state for s in manager.statuses()] == ["failed", "starting"]
        sigkill.failing = False

        await retry_until_started(manager, "on0", running=False, timeout=10)
        assert not alive(left_group)
        on0 = manager.supervisor("on0")
        assert on0 is not None
        await wait_for(lambda: on0.state == "running" and on1.state == "running", timeout=30)
    finally:
        await manager.close()
        if alive(left_group):
            os.killpg(left_group, signal.SIGKILL)


def test_a_record_that_cannot_be_read_for_now_is_kept_and_its_group_ended_by_the_next_try(
    tmp_path: Path, left_group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leftovers, "KILL_WAIT_S", 2.0)
    path = str(tmp_path / "logs" / f"old.{left_group}.group")

    def eio(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(leftovers, "open", eio, raising=False)
    found, left = leftovers.end_recorded([path], grace_s=0.2)
    assert (found, left) == (0, [leftovers.Leftover(path, None, None, None)])
    assert alive(left_group) and records(tmp_path) == [f"old.{left_group}.group"]  # not dropped
    monkeypatch.delattr(leftovers, "open")
    assert leftovers.end_recorded([path], grace_s=0.2) == (1, [])
    assert not alive(left_group) and records(tmp_path) == []


@pytest.mark.asyncio
async def test_a_try_that_cannot_read_the_record_for_now_keeps_the_devices_the_group_holds(
    tmp_path: Path, left_group: int, sigkill: SigkillFails, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, launcher = str(tmp_path / "logs"), fake_launcher(tmp_path / "pids")
    manager = EngineManager(launcher, logs, lambda s: None, devices={0}, grace_s=0.2, leftover_retry_s=0.0)
    try:
        assert await manager.end_leftovers() == 1
        await manager.apply([spec("on0", [0])])
        assert manager.supervisor("on0") is None  # postponed

        def eio(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(leftovers, "open", eio, raising=False)
        manager.retry_leftovers()
        assert manager._retrying is not None
        await manager._retrying
        monkeypatch.delattr(leftovers, "open")
        assert alive(left_group) and [g.pgid for g in manager.leftovers()] == [left_group]
        # The try's unreadable record replaced what was known (pgid, devices): the next desired
        # list started the deployment beside the group, on the memory it holds.
        await manager.apply([spec("on0", [0])])
        assert manager.supervisor("on0") is None
    finally:
        await manager.close()
