"""A deployment whose engine is launched again by its own supervisor (a crash restart, a restart
command) while another deployment's process group, which survived SIGKILL, holds one of its devices
is postponed as a start is: reported failed naming the group, started once the group is gone. Only
the manager's starts were checked: it was launched beside the group, on the memory the group holds
(a real engine fails there, again and again)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

from gpu_agent.engines import EngineManager
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import DeploymentStatus
from serving.backoff import Backoff
from tests.agent.test_engine_survivor_port import SigkillFails, failing_sigkill, retry_until_started
from tests.agent.test_engines import alive, fake_launcher, spec
from tests.agent.ws_server import wait_for


@pytest.fixture
def sigkill(monkeypatch: pytest.MonkeyPatch) -> SigkillFails:
    return failing_sigkill(monkeypatch)


class Held:
    """Deployment `a` on device 0 (ignoring SIGTERM) and `b` on devices 0 and 1, both running;
    then a's engine fails a health probe and its group survives SIGKILL, holding device 0."""

    def __init__(self, tmp_path: Path) -> None:
        self.statuses: list[DeploymentStatus] = []
        self.fail_health = tmp_path / "fail-health"
        self.a = spec("a", [0], fake_args=["--ignore-sigterm", "--health-fail-file", str(self.fail_health)])
        self.b = spec("b", [0, 1])
        self.manager = EngineManager(
            fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), self.statuses.append,
            devices={0, 1}, backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.1, seed=1),
            health_timeout_s=20, grace_s=0.3, scrape_interval_s=0.1,
            liveness=Liveness(interval_s=0.1, timeout_s=1.0, failures=1), leftover_retry_s=0.1,
        )  # fmt: skip
        self.group = 0

    def running(self, dep_id: str) -> EngineSupervisor | None:
        sup = self.manager.supervisor(dep_id)
        return sup if sup is not None and sup.state == "running" else None

    async def start(self) -> EngineSupervisor:
        """Both running, then a's group survives; b's supervisor (scraped at least once)."""
        await self.manager.apply([self.a, self.b])
        await wait_for(lambda: self.running("a") is not None and self.running("b") is not None, 30)
        a, b = self.manager.supervisor("a"), self.manager.supervisor("b")
        assert a is not None and a.pid is not None and b is not None
        self.group = a.pid
        self.fail_health.touch()
        await wait_for(lambda: self.manager.supervisor("a") is None, 30)
        assert alive(self.group) and [g.pgid for g in self.manager.leftovers()] == [self.group]
        await wait_for(lambda: b._metrics is not None, 10)
        return b

    def last(self, dep_id: str) -> DeploymentStatus:
        return [s for s in self.statuses if s.deployment_id == dep_id][-1]

    def postponed(self) -> bool:
        last = self.last("b")
        return self.manager.supervisor("b") is None and last.state == "failed"

    def names_the_group(self) -> None:
        last = self.last("b")
        assert last.error is not None and f"process group {self.group} of deployment a" in last.error
        assert [s.state for s in self.manager.statuses()] == ["failed", "failed"]  # a and b

    async def close(self, sigkill: SigkillFails) -> None:
        sigkill.failing = False
        await self.manager.close()
        if self.group and alive(self.group):
            os.killpg(self.group, signal.SIGKILL)


@pytest.mark.asyncio
async def test_a_crash_restart_waits_for_another_deployments_surviving_group_on_its_device(
    tmp_path: Path, sigkill: SigkillFails
) -> None:
    held = Held(tmp_path)
    try:
        b = await held.start()
        assert b.pid is not None and b.restarts == 0
        first = b.pid
        os.kill(first, signal.SIGKILL)  # b crashes: its restart would run beside a's group
        await wait_for(held.postponed, 10)  # it restarted there, and ran on
        held.names_the_group()
        assert "exited with code" in (held.last("b").error or "")  # its last run's error
        kept = b._unreported  # what its scrapes saw, not reported yet
        assert kept and alive(held.group)

        sigkill.failing = False

        await retry_until_started(held.manager, "b", running=True, timeout=30)
        again = held.manager.supervisor("b")
        assert again is not None and again is not b and again.pid not in (None, first)
        assert again.restarts == 1 and again._unreported == kept  # its crash restart, counted once
        assert not alive(held.group)
        await wait_for(lambda: held.running("a") is not None, 30)
    finally:
        await held.close(sigkill)


@pytest.mark.asyncio
async def test_a_restart_command_waits_for_another_deployments_surviving_group_on_its_device(
    tmp_path: Path, sigkill: SigkillFails, caplog: pytest.LogCaptureFixture
) -> None:
    held = Held(tmp_path)
    try:
        b = await held.start()
        first = b.pid
        with caplog.at_level(logging.INFO):
            assert await held.manager.restart("b") is True
        await wait_for(held.postponed, 10)  # it restarted beside a's group, and ran on
        assert any(
            r.getMessage() == "Deployment b starts once the engine group on its devices is gone."
            for r in caplog.records
        )
        held.names_the_group()
        assert first is not None and not alive(first) and alive(held.group)
        assert await held.manager.restart("b") is True  # postponed: still on this host
        assert held.manager.supervisor("b") is None

        sigkill.failing = False

        await retry_until_started(held.manager, "b", running=True, timeout=30)
        again = held.manager.supervisor("b")
        assert again is not None and again.restarts == 1 and again.pid not in (None, first)
    finally:
        await held.close(sigkill)


@pytest.mark.asyncio
async def test_a_deployment_postponed_at_its_restart_and_then_removed_is_reported_stopped(
    tmp_path: Path, sigkill: SigkillFails
) -> None:
    held = Held(tmp_path)
    try:
        await held.start()
        assert await held.manager.restart("b") is True
        await wait_for(held.postponed, 10)
        await held.manager.apply([held.a])  # the operator stops b (the control plane waits for `stopped`)
        assert held.last("b").state == "stopped"
        assert [s.deployment_id for s in held.manager.statuses()] == ["a"]

        sigkill.failing = False

        await retry_until_started(held.manager, "a", running=True, timeout=30)
        assert held.manager.supervisor("b") is None and held.last("b").state == "stopped"
    finally:
        await held.close(sigkill)
