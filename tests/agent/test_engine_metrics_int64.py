"""An engine's /metrics counter past the signed 64-bit range the control plane stores
(`vllm:kv_offload_store_bytes 1e30`) is a scrape that cannot be reported, skipped with a warning:
it went into the telemetry frame, and the control plane refused the host's whole frame every tick."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import EngineSample, ProtocolError
from tests.agent.test_engines import spec


@pytest.mark.parametrize("name", ["preemptions_total", "bytes_offloaded"])
def test_a_sample_refuses_a_counter_past_int64(name: str) -> None:
    EngineSample("d1", "running", **{name: 2**63 - 1})  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=name):
        EngineSample("d1", "running", **{name: 2**63})  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_scrape_with_a_counter_past_int64_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sup = EngineSupervisor(spec(), lambda s, p: None, str(tmp_path / "d1.log"), lambda s: None)  # type: ignore[arg-type,return-value]
    text = "# TYPE vllm:kv_offload_store_bytes gauge\nvllm:kv_offload_store_bytes 1e30\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        with caplog.at_level(logging.WARNING, logger="gpu_agent.engines.supervisor"):
            await sup._scrape(http)
    assert sup._gauges is None  # nothing the control plane would refuse is reported
    assert any("cannot be reported" in r.getMessage() for r in caplog.records)
