"""An engine whose process group survives the SIGKILL of a stop() or a restart() (and still answers
/health) is not watched on: the run ends once its group was ended as far as it could be, and the
group goes to the manager's leftover retry list (its port held). A stop(), so the agent's close(),
returns within about the grace period; it waited for the group to stop answering, for ever."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import gpu_agent.engines.supervisor as supervisor_module
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


async def running(tmp_path: Path, statuses: list[DeploymentStatus]) -> tuple[EngineManager, EngineSupervisor]:
    """A manager whose engine (ignoring SIGTERM, answering /health) runs."""
    manager = EngineManager(
        fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), statuses.append, devices={0},
        backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.1, seed=1), health_timeout_s=20,
        grace_s=0.3, scrape_interval_s=0.2, liveness=Liveness(interval_s=0.1, timeout_s=1.0),
        leftover_retry_s=0.1,
    )  # fmt: skip
    await manager.apply([spec(fake_args=["--ignore-sigterm"])])
    await wait_for(lambda: (sup := manager.supervisor("d1")) is not None and sup.state == "running", 30)
    sup = manager.supervisor("d1")
    assert sup is not None and sup.pid is not None and sup.port is not None
    return manager, sup


async def cleanup(manager: EngineManager, sup: EngineSupervisor, sigkill: SigkillFails, group: int) -> None:
    sigkill.failing = False
    if sup._task is not None and not sup._task.done():
        sup._task.cancel()  # (it hung)
    await asyncio.wait_for(manager.close(), 10)
    if alive(group):
        os.killpg(group, signal.SIGKILL)


@pytest.mark.asyncio
async def test_stopping_an_engine_whose_group_survives_sigkill_returns_and_hands_the_group_over(
    tmp_path: Path, sigkill: SigkillFails
) -> None:
    manager, sup = await running(tmp_path, [])
    group, port = sup.pid, sup.port
    assert group is not None
    try:
        started = time.monotonic()
        await asyncio.wait_for(manager.close(), 10)  # unbounded, it waited as long as /health answered
        assert time.monotonic() - started < 5  # grace 0.3 s + SIGKILL wait 0.3 s
        assert sup.state == "stopped" and alive(group)
        assert [g.pgid for g in manager.leftovers()] == [group] and port in manager.ports.held
    finally:
        await cleanup(manager, sup, sigkill, group)


@pytest.mark.asyncio
async def test_restarting_an_engine_whose_group_survives_sigkill_postpones_it_until_the_group_is_gone(
    tmp_path: Path, sigkill: SigkillFails
) -> None:
    statuses: list[DeploymentStatus] = []
    manager, sup = await running(tmp_path, statuses)
    group = sup.pid
    assert group is not None
    try:
        await manager.restart("d1")
        # It was left `running` on the group that survived for as long as that answered /health.
        await wait_for(lambda: manager.supervisor("d1") is None, 5)
        assert [g.pgid for g in manager.leftovers()] == [group] and alive(group)
        failed = statuses[-1]
        assert failed.state == "failed" and failed.error is not None and str(group) in failed.error
        assert "restart" in failed.error

        sigkill.failing = False

        await retry_until_started(manager, "d1", running=True, timeout=30)
        again = manager.supervisor("d1")
        assert again is not None and again.restarts == 1 and again.pid != group and not alive(group)
    finally:
        await cleanup(manager, sup, sigkill, group)


@pytest.mark.asyncio
async def test_restarting_a_deployment_postponed_for_its_surviving_group_is_not_refused_as_unknown(
    tmp_path: Path, sigkill: SigkillFails
) -> None:
    statuses: list[DeploymentStatus] = []
    manager, sup = await running(tmp_path, statuses)
    group = sup.pid
    assert group is not None
    try:
        await manager.restart("d1")
        await wait_for(lambda: manager.supervisor("d1") is None, 5)
        assert [s.deployment_id for s in manager.statuses()] == ["d1"]  # reported failed, on this host
        # It answered False ("deployment 'd1' is not on this host") for a deployment the host reports.
        assert await manager.restart("d1") is True
        assert manager.supervisor("d1") is None and alive(group)  # still not started beside the group
    finally:
        await cleanup(manager, sup, sigkill, group)


@pytest.mark.asyncio
async def test_a_deployment_postponed_for_its_surviving_group_and_then_removed_is_reported_stopped(
    tmp_path: Path, sigkill: SigkillFails
) -> None:
    statuses: list[DeploymentStatus] = []
    manager, sup = await running(tmp_path, statuses)
    group = sup.pid
    assert group is not None
    try:
        await manager.restart("d1")
        await wait_for(lambda: manager.supervisor("d1") is None, 5)
        assert statuses[-1].state == "failed"
        await manager.apply([])  # the operator stops it (the control plane waits for `stopped`)
        # Its last status stayed `failed`: it was dropped without a word, as no running engine is.
        assert (statuses[-1].deployment_id, statuses[-1].state) == ("d1", "stopped")
        assert manager.statuses() == [] and [g.pgid for g in manager.leftovers()] == [group]
    finally:
        await cleanup(manager, sup, sigkill, group)


@pytest.mark.asyncio
async def test_a_surviving_group_whose_record_could_not_be_written_is_not_taken_for_gone(
    tmp_path: Path, sigkill: SigkillFails, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_module, "write_record", lambda *args: None)  # (a full disk, say)
    manager, sup = await running(tmp_path, [])
    group = sup.pid
    assert group is not None
    try:
        await manager.restart("d1")
        await wait_for(lambda: manager.supervisor("d1") is None, 5)
        for _ in range(5):  # what the agent does every telemetry tick
            manager.retry_leftovers()
            await asyncio.sleep(0.2)
        # The retry found no record, took the group for gone (its port released) and started the
        # deployment again beside it.
        assert alive(group) and [g.pgid for g in manager.leftovers()] == [group]
        assert manager.supervisor("d1") is None
    finally:
        await cleanup(manager, sup, sigkill, group)
