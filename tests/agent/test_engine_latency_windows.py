"""Telemetry latency windows: every engine observation is reported exactly once, however the
/metrics scrapes (every interval plus the scrape's own duration) and the telemetry ticks (on the
wall clock) drift apart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from gpu_agent.engines.metrics import ITL, TTFT
from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory
from gpu_agent.protocol import EngineSample
from tests.agent.fake_engine import metrics_text
from tests.agent.test_engines import fake_launcher, spec
from tests.agent.ws_server import wait_for


def counts(sample: EngineSample) -> tuple[int, int]:
    assert sample.ttft is not None and sample.itl is not None
    return sample.ttft.count, sample.itl.count


class Engine:
    """/metrics of an engine that has made `scrapes` x (3 TTFT, 10 ITL) observations."""

    def __init__(self) -> None:
        self.scrapes = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=metrics_text(self.scrapes))


@pytest_asyncio.fixture
async def supervised(tmp_path: Path) -> AsyncIterator[tuple[EngineSupervisor, Engine, httpx.AsyncClient]]:
    engine = Engine()
    sup = EngineSupervisor(spec(), fake_launcher(tmp_path / "pids"), str(tmp_path / "log"), lambda s: None)
    sup.state = "running"
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handler), base_url="http://e") as http:
        yield sup, engine, http


@pytest.mark.asyncio
async def test_it_reports_a_scrape_window_once_when_two_ticks_fall_between_scrapes(
    supervised: tuple[EngineSupervisor, Engine, httpx.AsyncClient],
) -> None:
    sup, engine, http = supervised
    engine.scrapes = 1
    await sup._scrape(http)
    assert counts(sup.take_sample()) == (3, 10)  # the run so far
    # The next tick comes before the next scrape: nothing new was observed.
    assert counts(sup.take_sample()) == (0, 0)
    assert sup.take_sample().running == 3  # gauges still reported


@pytest.mark.asyncio
async def test_it_reports_every_window_when_two_scrapes_fall_between_ticks(
    supervised: tuple[EngineSupervisor, Engine, httpx.AsyncClient],
) -> None:
    sup, engine, http = supervised
    engine.scrapes = 1
    await sup._scrape(http)
    sup.take_sample()
    for n in (2, 3):  # a late tick: two scrapes since the last one
        engine.scrapes = n
        await sup._scrape(http)
    taken = sup.take_sample()
    assert counts(taken) == (6, 20)
    assert taken.ttft is not None and taken.ttft.p99 == pytest.approx(0.1 + 0.4 * 0.97)


@pytest.mark.asyncio
async def test_the_hosts_telemetry_windows_add_up_to_the_engines_histograms(tmp_path: Path) -> None:
    host = LocalHost(
        CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), with_aqua=False
    )
    await host.start(lambda s: None)
    assert host.engines is not None
    host.engines._scrape_s = 0.15  # scrapes faster than ticks: several fall between two of them
    try:
        await host.engines.apply([spec()])
        sup = host.engines.supervisor("d1")
        assert sup is not None
        await wait_for(lambda: sup._metrics is not None, timeout=30)
        reported = [0, 0]
        for pause in (0.0, 0.0, 0.5, 0.05, 0.4, 0.0, 0.6):
            await asyncio.sleep(pause)
            (engine,) = host.sample()[1]
            ttft, itl = counts(engine)
            reported = [reported[0] + ttft, reported[1] + itl]
        assert sup._metrics is not None
        seen = sup._metrics.histograms
        assert reported == [seen[TTFT].count, seen[ITL].count] and reported[0] >= 9
    finally:
        await host.stop()
