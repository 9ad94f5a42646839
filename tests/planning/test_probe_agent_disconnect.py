"""A probe whose host's agent disconnects while it waits for the answer fails once the agent has
stayed away for its grace period, naming the host: the agent sends a `probe_result` only over a
live connection, so the answer is lost, and the profile job would otherwise wait out the whole probe
timeout (10 minutes by default) before saying anything."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async
from inventory.models import Host, HostStatus
from planning.engine_probe import AgentEngineProbe
from planning.models import ProbeRequest, ProbeStatus

from serving.profiler import ProfilingError
from tests.planning.test_probe_relay import (
    SETTINGS,
    WORKLOAD,
    Measure,
    connect,
    next_probe,
    running_deployment,
    setup_host,
)
from tests.planning.test_probe_stop_on_cancel import no_more_probes

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


async def probe_sent(grace_s: float) -> tuple[Host, str, Any, Measure, dict[str, Any]]:
    """A measurement on a running deployment of a connected agent, whose probe the agent has
    received: (host, its token, the agent's socket, the measurement, the probe frame). Its timeout
    is far beyond Measure.wait's 30 s: only the agent's absence can end the wait in time."""
    host, token = await setup_host()
    comm = await connect(token)
    deployment = await running_deployment(host)
    probe = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=300, disconnect_grace_s=grace_s)
    measuring = Measure(lambda: probe.measure(1.0))
    measuring.start()
    return host, token, comm, measuring, await next_probe(comm)


@database_sync_to_async
def stored(frame: dict[str, Any]) -> ProbeRequest:
    return ProbeRequest.objects.get(probe_id=frame["probe_id"])


async def test_it_fails_the_probe_when_the_agent_disconnects_and_stays_away() -> None:
    with SETTINGS:
        _host, _token, comm, measuring, frame = await probe_sent(grace_s=0.5)
        await comm.disconnect()
        await measuring.wait()
        assert isinstance(measuring.error, ProfilingError), measuring.error
        message = str(measuring.error)
        assert "disconnected" in message and "'gpu-a'" in message and "run the profile job again" in message
        row = await stored(frame)
        assert row.status == ProbeStatus.FAILED and "disconnected" in row.error


async def test_it_keeps_waiting_for_an_agent_that_comes_back_within_the_grace() -> None:
    with SETTINGS:
        _host, token, comm, measuring, frame = await probe_sent(grace_s=5.0)
        await comm.disconnect()
        await asyncio.sleep(1.0)  # away for 20 polls of the worker, within the grace
        comm = await connect(token)  # back: its replay's answer comes over the new link
        report = {
            "v": 1,
            "type": "probe_result",
            "probe_id": frame["probe_id"],
            "deployment_id": frame["deployment_id"],
            "ok": True,
            "rate": 1.0,
            "num_requests": 12,
            "finished": 12,
            "ttft_p99_s": 0.1,
            "tbt_p99_s": 0.01,
            "ttft_p50_s": 0.05,
            "tbt_p50_s": 0.005,
            "kv_capacity_bytes": 1 << 30,
            "peak_kv_used_bytes": 1 << 20,
            "peak_kv_demand_bytes": 1 << 20,
            "kv_bytes_per_token": 1024,
        }
        await comm.send_json_to(report)
        await measuring.wait()
        assert measuring.error is None, measuring.error
        assert measuring.result.finished == 12
        await comm.disconnect()


@database_sync_to_async
def mark_offline(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)


async def test_it_fails_the_probe_when_the_host_went_offline_though_its_link_says_connected() -> None:
    # The ASGI process that held the agent's link died without marking it disconnected; the
    # liveness sweep then finds the host silent and marks it offline.
    with SETTINGS:
        host, _token, comm, measuring, frame = await probe_sent(grace_s=0.5)
        await mark_offline(host)
        await measuring.wait()
        assert isinstance(measuring.error, ProfilingError), measuring.error
        assert "'gpu-a'" in str(measuring.error)
        row = await stored(frame)
        assert row.status == ProbeStatus.FAILED
        await comm.disconnect()


async def test_a_probe_given_up_on_is_stopped_on_the_agent_when_it_comes_back() -> None:
    # The agent's link dropped while it replayed the probe; the worker gave up after the grace. The
    # agent, back later, may still be replaying it against its engine: it is told to stop, once.
    with SETTINGS:
        _host, token, comm, measuring, frame = await probe_sent(grace_s=0.3)
        await comm.disconnect()
        await measuring.wait()
        assert isinstance(measuring.error, ProfilingError), measuring.error
        comm = await connect(token)
        stop = await next_probe(comm)
        assert stop["cancel"] is True and stop["probe_id"] == frame["probe_id"]
        await no_more_probes(comm)  # once, not at every poll
        row = await stored(frame)
        assert row.status == ProbeStatus.FAILED and "disconnected" in row.error
        await comm.disconnect()
