"""Engines a killed agent left running (their leader did not exit on the SIGTERM the kernel sent
it when the agent died) are ended by the next agent on that state dir before it starts any."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpu_agent.engines.supervisor as supervisor_module
from gpu_agent.engines import EngineManager
from gpu_agent.engines.command import REPO_ROOT
from gpu_agent.engines.leftovers import end_leftovers, start_time
from gpu_agent.protocol import DeploymentStatus
from serving.backoff import Backoff
from tests.agent.test_engine_survivor_port import retry_until_started
from tests.agent.test_engines import alive, fake_launcher, spec
from tests.agent.ws_server import wait_for


async def killed_agent_leaving(tmp_path: Path, *engine_args: str) -> int:
    """Runs a stand-in agent whose engine gets `engine_args`, SIGKILLs the agent; the engine's pid."""
    pidfile = tmp_path / "pids"
    stand_in = str(Path(__file__).with_name("agent_stand_in.py"))
    agent = await asyncio.create_subprocess_exec(
        sys.executable, stand_in, str(tmp_path / "logs"), str(pidfile), *engine_args,
        env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert agent.stdout is not None
    assert (await asyncio.wait_for(agent.stdout.readline(), 30)).strip() == b"running"
    (engine,) = [int(x) for x in pidfile.read_text().split()]
    agent.kill()
    await agent.wait()
    return engine


@pytest.mark.asyncio
async def test_the_next_agent_ends_an_engine_a_killed_agent_left(tmp_path: Path) -> None:
    engine = await killed_agent_leaving(tmp_path, "--ignore-sigterm")
    try:
        # It ignored the SIGTERM the exec guard had the kernel send: it lives on, holding its GPUs.
        assert "ignoring SIGTERM" in await asyncio.to_thread(_log_when_told, tmp_path / "logs" / "d1.log")
        assert alive(engine)
        manager = EngineManager(
            fake_launcher(tmp_path / "pids2"),
            str(tmp_path / "logs"),
            lambda s: None,
            devices={0},
            grace_s=0.5,
        )
        assert await manager.end_leftovers() == 1
        assert not alive(engine)
        assert not list((tmp_path / "logs").glob("*.group"))
        await manager.close()
    finally:
        if alive(engine):
            os.kill(engine, signal.SIGKILL)  # do not leak it when the test fails


def _log_when_told(path: Path) -> str:
    for _ in range(200):
        text = path.read_text(errors="replace")
        if "ignoring SIGTERM" in text:
            return text
        time.sleep(0.05)
    return path.read_text(errors="replace")


def test_a_record_whose_pid_is_now_another_process_is_dropped_unsignalled(tmp_path: Path) -> None:
    # A group leader started after the record was written: its pid was reused, it is no engine.
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = start_time(other.pid)
        assert started is not None
        record = tmp_path / "d1.group"
        record.write_text(json.dumps({"pgid": other.pid, "start": started - 1, "deployment": "d1"}))
        assert end_leftovers(str(tmp_path), grace_s=0.1) == 0
        assert not record.exists() and other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()


@pytest.mark.asyncio
async def test_a_stopped_engine_leaves_no_record(tmp_path: Path) -> None:
    manager = EngineManager(
        fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), lambda s: None, devices={0}, grace_s=2
    )
    await manager.apply([spec()])
    await wait_for(lambda: (sup := manager.supervisor("d1")) is not None and sup.state == "running")
    (pid,) = manager_pids(tmp_path / "pids")
    assert [p.name for p in (tmp_path / "logs").glob("*.group")] == [f"d1.{pid}.group"]
    await manager.close()
    assert not list((tmp_path / "logs").glob("*.group"))


def manager_pids(pidfile: Path) -> list[int]:
    return [int(x) for x in pidfile.read_text().split()]


@pytest.mark.asyncio
async def test_a_group_left_after_sigkill_keeps_its_record_and_the_deployment_starts_again_once_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first engine's group outlives its SIGKILL (a worker in uninterruptible sleep, say): seen
    # here as the supervisor's check after the kill still finding it; the manager's next try finds
    # it gone. The deployment's next engine was started at once beside it, on the memory it held.
    first: list[int] = []
    monkeypatch.setattr(supervisor_module, "group_alive", lambda pgid: pgid in first)
    statuses: list[DeploymentStatus] = []
    manager = EngineManager(
        fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), statuses.append, devices={0}, grace_s=0.5,
        backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.1, seed=1), leftover_retry_s=0.1,
    )  # fmt: skip

    def records() -> dict[int, str]:
        return {json.loads(p.read_text())["pgid"]: p.name for p in (tmp_path / "logs").glob("*.group")}

    try:
        await manager.apply([spec()])
        await wait_for(lambda: (sup := manager.supervisor("d1")) is not None and sup.state == "running")
        first.extend(manager_pids(tmp_path / "pids"))
        os.kill(first[0], signal.SIGKILL)
        await wait_for(lambda: manager.supervisor("d1") is None)
        await asyncio.sleep(0.5)  # (five backoffs)
        # Its record is kept for a later agent, it is tried again like a killed agent's group, and
        # no engine starts beside it: the deployment is failed, naming it.
        assert len(manager_pids(tmp_path / "pids")) == 1 and records() == {first[0]: f"d1.{first[0]}.group"}
        assert [g.pgid for g in manager.leftovers()] == [first[0]]
        error = statuses[-1].error
        assert statuses[-1].state == "failed" and error is not None
        assert f"held by process group {first[0]} of deployment d1 on device(s) [0]" in error, error
        assert "engine exited with code -9" in error

        # Gone: the deployment starts again, counted as a restart.
        await retry_until_started(manager, "d1", running=True, timeout=10)
        sup = manager.supervisor("d1")
        assert sup is not None and sup.restarts == 1 and manager.leftovers() == []
        second = manager_pids(tmp_path / "pids")[1]
        assert records() == {second: f"d1.{second}.group"}
    finally:
        await manager.close()
