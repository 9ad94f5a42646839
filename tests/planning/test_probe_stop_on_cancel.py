"""A probe cancelled after it reached the agent is stopped there: the relay sends its frame again
with `cancel`, once, so a cancelled profile job leaves no load on the engine. Driven through the
real ASGI application, as in test_probe_relay.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from jobs.models import Job, JobStatus
from planning.engine_probe import AgentEngineProbe
from planning.models import ProbeRequest, ProbeStatus

from serving.profiler import ProfilingCancelled
from tests.planning.test_probe_relay import (
    SETTINGS,
    WORKLOAD,
    Measure,
    connect,
    next_probe,
    running_deployment,
    setup_host,
)

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


async def no_more_probes(comm: WebsocketCommunicator, seconds: float = 0.6) -> None:
    """Nothing but desired_deployments pushes arrives within `seconds`."""
    while not await comm.receive_nothing(timeout=seconds):
        assert (await comm.receive_json_from())["type"] != "probe"


async def test_a_probe_cancelled_by_its_job_is_stopped_on_the_agent_once() -> None:
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
        frame = await next_probe(comm)
        assert frame["cancel"] is False
        cancelled.set()
        await measuring.wait()
        assert isinstance(measuring.error, ProfilingCancelled)
        stop = await next_probe(comm)
        assert stop["cancel"] is True
        assert {k: v for k, v in stop.items() if k != "cancel"} == {
            k: v for k, v in frame.items() if k != "cancel"
        }
        await no_more_probes(comm)  # once, not at every poll
        row = await database_sync_to_async(ProbeRequest.objects.get)(probe_id=frame["probe_id"])
        assert row.status == ProbeStatus.CANCELLED
        await comm.disconnect()


@database_sync_to_async
def sent_probe_of_a_job(host: Any, deployment: Any, status: JobStatus) -> ProbeRequest:
    from django.utils import timezone

    job = Job.objects.create(kind="profile", params={}, status=status)
    frame = {
        "v": 1,
        "type": "probe",
        "probe_id": f"p{job.pk}",
        "deployment_id": str(deployment.pk),
        "rate": 1.0,
    }
    frame |= {"requests": [{"arrival_s": 0.0, "prompt_tokens": 4, "max_tokens": 4}], "timeout_s": 30.0}
    frame |= {"seed": 0, "cancel": False}
    return ProbeRequest.objects.create(
        probe_id=f"p{job.pk}",
        host=host,
        job=job,
        frame=frame,
        status=ProbeStatus.SENT,
        sent_at=timezone.now(),
    )


async def test_a_sent_probe_whose_job_no_longer_runs_is_cancelled_and_stopped() -> None:
    """The worker died (or the job was cancelled before the worker noticed) while the agent replays."""
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        orphan = await sent_probe_of_a_job(host, deployment, JobStatus.CANCELLED)
        live = await sent_probe_of_a_job(host, deployment, JobStatus.RUNNING)
        stop = await next_probe(comm)
        assert (stop["probe_id"], stop["cancel"]) == (orphan.probe_id, True)
        await no_more_probes(comm)
        get = database_sync_to_async(ProbeRequest.objects.get)
        assert (await get(pk=orphan.pk)).status == ProbeStatus.CANCELLED
        assert (await get(pk=live.pk)).status == ProbeStatus.SENT  # its worker still waits for it
        await comm.disconnect()
