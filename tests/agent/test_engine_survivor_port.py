"""The port of an engine run whose process group survived SIGKILL stays held while the group is
there (it may still listen on it) and is released once the manager's retry finds the group gone."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import gpu_agent.engines.leftovers as leftovers
import gpu_agent.engines.process_group as process_group
from gpu_agent.engines import EngineManager
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.ports import PortAllocator, free_port
from serving.backoff import Backoff
from tests.agent.test_engines import alive, fake_launcher, spec
from tests.agent.ws_server import wait_for


class SigkillFails:
    """`signal_group` that drops SIGKILL while `failing` (a group stuck in the kernel, say)."""

    def __init__(self) -> None:
        self.failing = True
        self.real = process_group.signal_group

    def __call__(self, pgid: int, sig: signal.Signals) -> None:
        if not (self.failing and sig == signal.SIGKILL):
            self.real(pgid, sig)


def failing_sigkill(monkeypatch: pytest.MonkeyPatch) -> SigkillFails:
    """Make SIGKILL of an engine group fail (a group that survives it) for the test's duration,
    both where the supervisor ends a run and where the leftover retry does."""
    fails = SigkillFails()
    for module in (process_group, leftovers):
        monkeypatch.setattr(module, "signal_group", fails)
        monkeypatch.setattr(module, "KILL_WAIT_S", 0.3)
    return fails


async def retry_until_started(manager: EngineManager, dep_id: str, *, running: bool, timeout: float) -> None:
    """Do what the agent does every telemetry tick (try the leftover groups again) until deployment
    `dep_id` has an engine again (with `running`: one that reached running)."""

    def started() -> bool:
        manager.retry_leftovers()
        sup = manager.supervisor(dep_id)
        return sup is not None and (not running or sup.state == "running")

    await wait_for(started, timeout)


class Picks:
    """The kernel's choice of a free port, scripted: `ports` first, then any free one."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def __call__(self) -> int:
        return self.ports.pop(0) if self.ports else free_port()


@pytest.mark.asyncio
async def test_a_surviving_groups_port_is_held_until_the_retry_finds_it_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sigkill = failing_sigkill(monkeypatch)
    p1 = free_port()
    p2 = free_port()
    while p2 == p1:
        p2 = free_port()
    # a's first run gets p1; b, started while a's group survives, is offered p1 first; a's next run too.
    ports = PortAllocator(Picks(p1, p1, p2, p1))
    fail_health = tmp_path / "fail-health"
    a = spec("a", [0], fake_args=["--ignore-sigterm", "--health-fail-file", str(fail_health)])
    b = spec("b", [1])
    manager = EngineManager(
        fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), lambda s: None, devices={0, 1},
        backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.1, seed=1), health_timeout_s=20,
        grace_s=0.3, scrape_interval_s=0.2, liveness=Liveness(interval_s=0.1, timeout_s=1.0, failures=1),
        ports=ports, leftover_retry_s=0.1,
    )  # fmt: skip
    group = 0
    try:
        await manager.apply([a])
        await wait_for(lambda: (sup := manager.supervisor("a")) is not None and sup.state == "running", 30)
        first = manager.supervisor("a")
        assert first is not None and first.port == p1 and first.pid is not None
        group = first.pid
        fail_health.touch()  # a failed probe: the run ends, and its group outlives SIGTERM and SIGKILL
        await wait_for(lambda: manager.supervisor("a") is None, 30)
        assert alive(group) and [g.pgid for g in manager.leftovers()] == [group]
        assert p1 in ports.held  # the group still listens on it

        await manager.apply([a, b])  # b's engine is not given p1, where it could not listen
        await wait_for(lambda: (sup := manager.supervisor("b")) is not None and sup.state == "running", 30)
        on1 = manager.supervisor("b")
        assert on1 is not None and on1.port == p2 and on1.restarts == 0
        assert manager.supervisor("a") is None and p1 in ports.held

        sigkill.failing = False

        # Gone: its port is free again, and a's next run gets it.
        await retry_until_started(manager, "a", running=True, timeout=30)
        assert not alive(group) and manager.leftovers() == []
        again = manager.supervisor("a")
        assert again is not None and again.port == p1 and again.pid not in (None, group)
    finally:
        sigkill.failing = False
        await manager.close()
        if group and alive(group):
            os.killpg(group, signal.SIGKILL)
