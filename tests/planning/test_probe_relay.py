"""Real-engine probes cross processes through the database: a worker-side AgentEngineProbe writes a
ProbeRequest, the agent's websocket consumer relays it as a `probe` frame and stores the agent's
`probe_result`, and the probe returns it. Driven through the real ASGI application."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from deployments.models import Deployment, ObservedState
from deployments.services import create_deployment
from django.test import override_settings
from inventory.models import Device, Host
from inventory.services import issue_agent_token, register_host
from planning.engine_probe import AgentEngineProbe
from planning.models import ProbeRequest, ProbeStatus

from config.asgi import application
from serving.profiler import ProfilingCancelled, ProfilingError, WorkloadSpec
from tests.planning.helpers import make_model

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]
SETTINGS = override_settings(
    AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0, PLANNING_PROBE_POLL_S=0.1
)
WORKLOAD = WorkloadSpec(num_requests=12, seed=5, max_context=512)


def register(host: str) -> dict[str, Any]:
    device = {
        "index": 0,
        "uuid": f"GPU-{host}-0",
        "name": "NVIDIA H100",
        "kind": "gpu",
        "memory_total_bytes": 80 << 30,
        "nvlink_peers": [],
    }
    return {
        "v": 1,
        "type": "register",
        "host": host,
        "address": "127.0.0.1",
        "agent_version": "test",
        "simulated": False,
        "devices": [device],
    }


@database_sync_to_async
def setup_host() -> tuple[Host, str]:
    host = register_host("gpu-a", "127.0.0.1")
    return host, issue_agent_token(host).plaintext


@database_sync_to_async
def running_deployment(host: Host) -> Deployment:
    model = make_model("tiny")
    deployment = create_deployment(model, host, list(Device.objects.filter(host=host)))
    Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.RUNNING)
    return Deployment.objects.select_related("host", "model").get(pk=deployment.pk)


async def connect(token: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    assert (await comm.connect())[0]
    await comm.send_json_to(register("gpu-a"))
    assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
    return comm


async def next_probe(comm: WebsocketCommunicator) -> dict[str, Any]:
    while True:  # desired_deployments pushes may come first
        frame = await comm.receive_json_from(timeout=10)
        if frame["type"] == "probe":
            return frame


class Measure(threading.Thread):
    """Runs a blocking probe call as the Celery worker would, in its own thread and connection."""

    def __init__(self, call: Any) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:
            self.error = exc

    async def wait(self) -> None:
        await asyncio.to_thread(self.join, 30)
        assert not self.is_alive()


async def test_it_relays_a_probe_to_the_agent_and_returns_its_answer() -> None:
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        probe = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=30)
        measuring = Measure(lambda: probe.measure(2.0))
        measuring.start()
        frame = await next_probe(comm)
        sent = WORKLOAD.requests(2.0)
        assert frame["deployment_id"] == str(deployment.pk) and frame["rate"] == 2.0
        assert [(r["arrival_s"], r["prompt_tokens"], r["max_tokens"]) for r in frame["requests"]] == [
            (r.arrival, r.prompt_tokens, r.output_tokens) for r in sent
        ]
        await comm.send_json_to(
            {
                "v": 1,
                "type": "probe_result",
                "probe_id": frame["probe_id"],
                "deployment_id": frame["deployment_id"],
                "ok": True,
                "rate": 2.0,
                "num_requests": len(sent),
                "finished": len(sent) - 1,
                "ttft_p99_s": 0.4,
                "tbt_p99_s": None,  # infinitely late
                "ttft_p50_s": 0.1,
                "tbt_p50_s": 0.02,
                "kv_capacity_bytes": 1000,
                "peak_kv_used_bytes": 600,
                "peak_kv_demand_bytes": 900,
                "kv_bytes_per_token": 8,
                "prefill_samples": [{"lens": [12], "seconds": 0.05}],
                "decode_samples": [{"lens": [13, 30], "seconds": 0.02}],
            }
        )
        await measuring.wait()
        assert measuring.error is None, measuring.error
        result = measuring.result
        assert (result.rate, result.ttft_p99_s, result.ttft_p50_s, result.tbt_p50_s) == (2.0, 0.4, 0.1, 0.02)
        assert math.isinf(result.tbt_p99_s)
        assert (result.num_requests, result.finished, result.free_kv_bytes) == (len(sent), len(sent) - 1, 400)
        assert probe.kv_bytes_per_token == 8
        assert result.prefill_samples == (((12,), 0.05),) and result.decode_samples == (((13, 30), 0.02),)
        row = await database_sync_to_async(ProbeRequest.objects.get)(probe_id=frame["probe_id"])
        assert row.status == ProbeStatus.DONE and row.sent_at is not None and row.result is not None
        await comm.disconnect()


async def test_it_fails_the_probe_naming_host_and_model_when_the_agent_cannot_run_it() -> None:
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        probe = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=30)
        measuring = Measure(lambda: probe.measure_burst(1.0, 4.0))
        measuring.start()
        frame = await next_probe(comm)
        assert len(frame["requests"]) == len(WORKLOAD.burst_requests(1.0, 4.0))
        await comm.send_json_to(
            {
                "v": 1,
                "type": "probe_result",
                "probe_id": frame["probe_id"],
                "deployment_id": frame["deployment_id"],
                "ok": False,
                "error": "engine exploded",
            }
        )
        await measuring.wait()
        assert isinstance(measuring.error, ProfilingError)
        text = str(measuring.error)
        assert "engine exploded" in text and "'tiny'" in text and "'gpu-a'" in text
        await comm.disconnect()
        # with the agent gone, a probe fails at once instead of waiting for an answer
        refused = Measure(lambda: probe.measure(1.0))
        refused.start()
        await refused.wait()
        assert isinstance(refused.error, ProfilingError) and "not connected" in str(refused.error)


async def test_it_stops_waiting_for_the_agent_when_the_job_is_cancelled() -> None:
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        cancelled = threading.Event()
        probe = AgentEngineProbe(
            deployment, WORKLOAD, poll_s=0.05, timeout_s=30, should_cancel=cancelled.is_set
        )
        measuring = Measure(lambda: probe.measure(1.0))
        measuring.start()
        frame = await next_probe(comm)  # the agent got it and is replaying; the job is cancelled
        cancelled.set()
        await measuring.wait()
        assert isinstance(measuring.error, ProfilingCancelled)
        row = await database_sync_to_async(ProbeRequest.objects.get)(probe_id=frame["probe_id"])
        assert row.status == ProbeStatus.CANCELLED
        await comm.disconnect()


async def refused_unsent(call: Any) -> str:
    """Run a probe call that must be refused before anything is sent; its error message."""
    measuring = Measure(call)
    measuring.start()
    await measuring.wait()
    assert isinstance(measuring.error, ProfilingError), measuring.error
    assert await database_sync_to_async(ProbeRequest.objects.count)() == 0  # nothing sent
    return str(measuring.error)


async def test_a_probe_whose_requests_would_outlast_its_timeout_is_refused_before_it_is_sent() -> None:
    # 12 requests at 0.01 req/s arrive over about 1100 s: the agent would stop the replay at 30 s
    # with most of them unsent, and they would count as missing the SLO.
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        probe = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=30)
        span = max(r.arrival for r in WORKLOAD.requests(0.01))
        assert span > 30
        message = await refused_unsent(lambda: probe.measure(0.01))
        assert f"over {span:.0f} s" in message and "probe_timeout_s (30 s)" in message
        assert "deployment" in message and "gpu-a" in message
        await comm.disconnect()


async def test_a_burst_probe_is_refused_only_when_its_burst_would_outlast_the_timeout() -> None:
    # The burst window is max(12 / 1 req/s, 3 x 10 s) = 30 s with the 10 s burst in its middle
    # (10-20 s): a 25 s timeout cuts only background load, a 15 s one would cut the burst itself.
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        short = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=15)
        message = await refused_unsent(lambda: short.measure_burst(1.0, 4.0))
        assert "bursts until 20 s, after probe_timeout_s (15 s)" in message and "burst_duration_s" in message
        long_enough = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=25)
        sending = Measure(lambda: long_enough.measure_burst(1.0, 4.0))
        sending.start()
        frame = await next_probe(comm)  # sent to the agent, though its window (30 s) is longer
        assert frame["timeout_s"] == 25
        # End the wait for its answer: as if the agent had reported it could not run it.
        await database_sync_to_async(ProbeRequest.objects.update)(status=ProbeStatus.FAILED, error="done")
        await sending.wait()
        assert isinstance(sending.error, ProfilingError) and "failed: done" in str(sending.error)
        await comm.disconnect()
