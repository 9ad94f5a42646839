"""Latencies an engine run observed after the last telemetry take are reported when the run ends
between two ticks: after a crash, an operator restart, or a new spec that replaces the supervisor.
Every observation the agent scraped is reported exactly once."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

import gpu_agent.engines.leftovers as leftovers
import gpu_agent.engines.process_group as process_group
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.manager import EngineManager
from gpu_agent.engines.metrics import ITL, TTFT
from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import EngineSample
from tests.agent.fake_engine import metrics_text
from tests.agent.test_engine_survivor_port import SigkillFails, retry_until_started
from tests.agent.test_engines import alive, fake_launcher, spec
from tests.agent.ws_server import wait_for

Scraped = dict[object, tuple[float, float]]  # engine process -> its latest scrape's (TTFT, ITL) counts


@pytest.fixture
def scraped(monkeypatch: pytest.MonkeyPatch) -> Scraped:
    """What the supervisors scraped, per engine run (the histograms are cumulative per run)."""
    seen: Scraped = {}
    scrape = EngineSupervisor._scrape

    async def spy(self: EngineSupervisor, http: httpx.AsyncClient) -> None:
        await scrape(self, http)
        if self._metrics is not None and self._proc is not None:
            h = self._metrics.histograms
            seen[self._proc] = (h[TTFT].count, h[ITL].count)

    monkeypatch.setattr(EngineSupervisor, "_scrape", spy)
    return seen


@pytest_asyncio.fixture
async def manager(tmp_path: Path) -> AsyncIterator[EngineManager]:
    m = EngineManager(
        fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), lambda s: None, devices={0},
        scrape_interval_s=0.1, grace_s=2.0,
    )  # fmt: skip
    yield m
    await m.close()


class Reported:
    """Sums the latency counts of the telemetry takes."""

    def __init__(self, manager: EngineManager) -> None:
        self.manager = manager
        self.counts = [0, 0]

    def take(self) -> EngineSample:
        (e,) = self.manager.take_samples()
        self.counts[0] += e.ttft.count if e.ttft else 0
        self.counts[1] += e.itl.count if e.itl else 0
        return e


def total(scraped: Scraped) -> list[float]:
    return [sum(c[0] for c in scraped.values()), sum(c[1] for c in scraped.values())]


async def two_scrapes_then_take(sup: EngineSupervisor, reported: Reported) -> None:
    """A take in the middle of a run, then a scrape it does not cover."""
    await wait_for(lambda: sup.state == "running" and sup._metrics is not None, timeout=30)
    reported.take()
    taken = sup._metrics
    await wait_for(lambda: sup._metrics is not taken, timeout=10)


async def stop_and_take_the_rest(sup: EngineSupervisor, reported: Reported) -> None:
    await sup.stop()  # (still the manager's: its take reports what the run left)
    for _ in range(3):
        assert reported.take().state == "stopped"


@pytest.mark.asyncio
async def test_a_crash_between_two_ticks_loses_no_latencies(manager: EngineManager, scraped: Scraped) -> None:
    await manager.apply([spec()])
    sup = manager.supervisor("d1")
    assert sup is not None
    reported = Reported(manager)
    await two_scrapes_then_take(sup, reported)
    assert sup.pid is not None
    os.kill(sup.pid, signal.SIGKILL)
    await wait_for(lambda: sup.state == "failed", timeout=10)
    run = total(scraped)
    failed = reported.take()
    assert failed.state == "failed" and failed.ttft is not None and failed.ttft.count > 0
    assert reported.counts == run and run[0] >= 6
    assert reported.take().ttft is None  # reported once
    assert reported.counts == run


@pytest.mark.asyncio
async def test_an_operator_restart_between_two_ticks_loses_no_latencies(
    manager: EngineManager, scraped: Scraped
) -> None:
    await manager.apply([spec()])
    sup = manager.supervisor("d1")
    assert sup is not None
    reported = Reported(manager)
    await two_scrapes_then_take(sup, reported)
    first = sup.pid
    assert await manager.restart("d1")
    await wait_for(lambda: sup.pid not in (None, first), timeout=30)
    await two_scrapes_then_take(sup, reported)  # the second run (the first take adds the first's rest)
    assert len(scraped) == 2
    await stop_and_take_the_rest(sup, reported)
    assert reported.counts == total(scraped)


@pytest.mark.asyncio
async def test_a_new_spec_reports_what_the_replaced_engine_left(
    manager: EngineManager, scraped: Scraped
) -> None:
    await manager.apply([spec()])
    old = manager.supervisor("d1")
    assert old is not None
    reported = Reported(manager)
    await two_scrapes_then_take(old, reported)
    await manager.apply([spec(seed=7)])  # a changed spec: a new supervisor for d1
    new = manager.supervisor("d1")
    assert new is not None and new is not old
    await two_scrapes_then_take(new, reported)
    assert len(scraped) == 2
    await stop_and_take_the_rest(new, reported)
    assert reported.counts == total(scraped)


class Engine:
    def __init__(self, text: str) -> None:
        self.text = text

    def handler(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=self.text)


@pytest.mark.asyncio
async def test_an_ended_run_with_other_buckets_is_reported_alone_then_the_new_run(tmp_path: Path) -> None:
    sup = EngineSupervisor(spec(), fake_launcher(tmp_path / "pids"), str(tmp_path / "log"), lambda s: None)
    sup.state = "running"
    engine = Engine(metrics_text(2))
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handler), base_url="http://e") as http:
        await sup._scrape(http)
        sup.take_sample()
        engine.text = metrics_text(5)
        await sup._scrape(http)
        sup._keep_unreported()  # the run ends: 9 TTFT and 30 ITL observations not reported yet
        # The next run's engine buckets TTFT differently.
        engine.text = metrics_text(1).replace('le="0.5"', 'le="0.4"')
        await sup._scrape(http)
        ended, new = sup.take_sample(), sup.take_sample()
    assert ended.ttft is not None and ended.itl is not None
    assert (ended.ttft.count, ended.itl.count) == (9, 30)
    assert new.ttft is not None and new.itl is not None
    assert (new.ttft.count, new.itl.count) == (3, 10)
    assert new.ttft.p99 is not None and new.ttft.p99 <= 0.4 and ended.ttft.p99 is not None
    assert ended.ttft.p99 > 0.4


@pytest.mark.asyncio
async def test_a_new_spec_postponed_for_the_group_the_replaced_engine_left_reports_that_engines_rest(
    tmp_path: Path, scraped: Scraped, monkeypatch: pytest.MonkeyPatch
) -> None:
    sigkill = SigkillFails()
    for module in (process_group, leftovers):
        monkeypatch.setattr(module, "signal_group", sigkill)
        monkeypatch.setattr(module, "KILL_WAIT_S", 0.3)
    manager = EngineManager(
        fake_launcher(tmp_path / "pids"), str(tmp_path / "logs"), lambda s: None, devices={0},
        scrape_interval_s=0.1, grace_s=0.3, liveness=Liveness(interval_s=0.1, timeout_s=1.0),
        leftover_retry_s=0.1,
    )  # fmt: skip
    group = 0
    try:
        await manager.apply([spec(fake_args=["--ignore-sigterm"])])
        old = manager.supervisor("d1")
        assert old is not None
        reported = Reported(manager)
        await two_scrapes_then_take(old, reported)
        group = old.pid or 0
        await manager.apply([spec(seed=7)])  # the old engine's group survives its stop: postponed
        assert manager.supervisor("d1") is None and [g.pgid for g in manager.leftovers()] == [group]
        reported.take()
        sigkill.failing = False

        await retry_until_started(manager, "d1", running=False, timeout=10)
        new = manager.supervisor("d1")
        assert new is not None
        await two_scrapes_then_take(new, reported)
        assert len(scraped) == 2
        await stop_and_take_the_rest(new, reported)
        # The replaced engine's scrapes after the last take were dropped once its successor waited.
        assert reported.counts == total(scraped)
    finally:
        sigkill.failing = False
        await manager.close()
        if group and alive(group):
            os.killpg(group, signal.SIGKILL)
