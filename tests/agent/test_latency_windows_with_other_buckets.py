"""Latency windows that cannot be added up (an engine run that buckets a histogram differently) are
reported apart, in order (`metrics.combine`), by the takes and by the runs that end unreported."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from gpu_agent.engines.metrics import ITL, TTFT, Histogram, combine
from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import EngineSample
from tests.agent.fake_engine import metrics_text
from tests.agent.test_engines import fake_launcher, spec

INF = math.inf
FIRST = {TTFT: Histogram(((0.1, 2.0), (INF, 3.0)))}


def counts(sample: EngineSample) -> tuple[int, int] | None:
    if sample.ttft is None or sample.itl is None:
        return None
    return sample.ttft.count, sample.itl.count


def test_it_adds_up_windows_of_one_bucket_layout() -> None:
    then = {TTFT: Histogram(((0.1, 1.0), (INF, 1.0))), ITL: Histogram(((INF, 4.0),))}
    assert combine(FIRST, then) == [
        {TTFT: Histogram(((0.1, 3.0), (INF, 4.0))), ITL: Histogram(((INF, 4.0),))}
    ]


def test_it_keeps_windows_of_other_bucket_layouts_apart_in_order() -> None:
    then = {TTFT: Histogram(((0.2, 1.0), (INF, 1.0))), ITL: Histogram(((INF, 4.0),))}
    assert combine(FIRST, then) == [FIRST, then]


@pytest.mark.asyncio
async def test_two_ended_runs_with_other_buckets_are_reported_one_take_each(tmp_path: Path) -> None:
    sup = EngineSupervisor(spec(), fake_launcher(tmp_path / "pids"), str(tmp_path / "log"), lambda s: None)
    sup.state = "running"
    text = metrics_text(2)  # 6 TTFT and 20 ITL observations
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://e") as http:
        await sup._scrape(http)
        sup._keep_unreported()  # the run ends before any take
        text = metrics_text(1).replace('le="0.5"', 'le="0.4"')  # the next run buckets TTFT otherwise
        await sup._scrape(http)
        sup._keep_unreported()  # and ends before any take too
    sup.state = "failed"
    assert [counts(sup.take_sample()) for _ in range(3)] == [(6, 20), (3, 10), None]
