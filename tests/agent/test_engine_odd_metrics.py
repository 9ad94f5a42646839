"""A /metrics answer the agent cannot turn into telemetry (a value that is no finite number, one
beyond the protocol's range, a histogram bucket without `le`) is a scrape that failed, like an
unanswered one: the engine keeps running. It used to raise out of the scrape loop and end the
healthy engine as failed, to be restarted (and to fail again) for ever."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_agent.engines.metrics import EngineMetrics, parse_metrics
from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import DeploymentStatus
from tests.agent.test_engines import fake_launcher, manager, spec
from tests.agent.ws_server import wait_for

OFFLOADED_INF = "# TYPE vllm:kv_offload_store_bytes_total counter\nvllm:kv_offload_store_bytes_total +Inf\n"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running +Inf\n",
            "vllm:num_requests_running",
        ),
        (
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting NaN\n",
            "vllm:num_requests_waiting",
        ),
        (OFFLOADED_INF, "vllm:kv_offload_store_bytes_total"),
        (
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            'vllm:time_to_first_token_seconds_bucket{model_name="m"} 3\n',
            "vllm:time_to_first_token_seconds_bucket",
        ),
        (
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            'vllm:inter_token_latency_seconds_bucket{le="+Inf"} NaN\n',
            "vllm:inter_token_latency_seconds_bucket",
        ),
    ],
)
def test_parse_metrics_names_a_sample_it_cannot_read(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_metrics(text)


@pytest.mark.asyncio
@pytest.mark.parametrize("parsed", [None, EngineMetrics(running=2**31)], ids=["+Inf", "running=2**31"])
async def test_an_engine_whose_metrics_hold_a_value_out_of_range_keeps_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parsed: EngineMetrics | None
) -> None:
    if parsed is not None:  # figures the frame cannot carry (its running is 0..2**31-1)
        monkeypatch.setattr("gpu_agent.engines.supervisor.parse_metrics", lambda text: parsed)
    scrapes = 0
    scrape = EngineSupervisor._scrape

    async def counted(self: EngineSupervisor, http: object) -> None:
        nonlocal scrapes
        scrapes += 1
        await scrape(self, http)  # type: ignore[arg-type]

    monkeypatch.setattr(EngineSupervisor, "_scrape", counted)
    statuses: list[DeploymentStatus] = []
    m = manager(tmp_path, fake_launcher(tmp_path / "pids"), statuses, scrape_interval_s=0.05)
    try:
        await m.apply([spec(fake_args=["--extra-metrics", OFFLOADED_INF])])
        await wait_for(lambda: scrapes >= 5)
        states = [s.state for s in statuses]
        sup = m.supervisor("d1")
        assert sup is not None
        assert states == ["starting", "running"] and sup.state == "running" and sup.restarts == 0, statuses
    finally:
        await m.close()
