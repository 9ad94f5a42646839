"""Telemetry naming a deployment or device deleted while its frame was in flight (built before the
delete, written after it): those rows are dropped quietly and the rest of the frame is stored. The
foreign key refused the whole group commit, then the host's frame in its own transaction: the
host's device samples were lost with an ERROR logged."""

from __future__ import annotations

import logging

import pytest
from agents.ingest import TelemetryWriter, rows_for
from agents.models import DeviceSample, EngineSample
from agents.services import LinkedHost
from channels.db import database_sync_to_async
from deployments.models import Deployment
from inventory.models import Device
from inventory.services import register_host
from registry.models import ServedModel

from gpu_agent.protocol import Telemetry, parse_frame

from .conftest import AgentHost, device_sample, telemetry_frame

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


def engine(deployment_id: int) -> dict[str, object]:
    return {"deployment_id": str(deployment_id), "state": "running", "running": 1, "waiting": 0}


@database_sync_to_async
def linked_host(name: str, model: ServedModel, gpus: int = 2) -> tuple[LinkedHost, Deployment]:
    """A host with ``gpus`` devices and a deployment on device 0, as a connection knows it."""
    host = register_host(name)
    devices = {
        i: Device.objects.create(
            host=host, index=i, uuid=f"GPU-{name}-{i}", name="H100", memory_total_bytes=80 << 30
        ).pk
        for i in range(gpus)
    }
    deployment = Deployment.objects.create(model=model, host=host)
    return LinkedHost(host.pk, name, "10.0.0.5", False, devices, {deployment.pk}), deployment


def frame_of(deployment: Deployment, gpus: int = 2) -> Telemetry:
    frame = parse_frame(telemetry_frame([device_sample(i) for i in range(gpus)], [engine(deployment.pk)]))
    assert isinstance(frame, Telemetry)
    return frame


@database_sync_to_async
def stored() -> tuple[list[tuple[str, int]], list[int]]:
    devices = DeviceSample.objects.order_by("device__host__name", "device__index")
    return (
        list(devices.values_list("device__host__name", "device__index")),
        list(EngineSample.objects.order_by("deployment_id").values_list("deployment_id", flat=True)),
    )


@pytest.mark.parametrize("frames", [1, 3], ids=["alone", "in-a-group-commit"])
async def test_it_stores_a_frame_whose_deployment_was_deleted_meanwhile_without_it(
    agent_host: AgentHost, served_model: ServedModel, caplog: pytest.LogCaptureFixture, frames: int
) -> None:
    a, gone = await linked_host("gpu-b", served_model)
    b, kept = await linked_host("gpu-c", served_model)
    batches = [rows_for(a, frame_of(gone))] + [rows_for(b, frame_of(kept)) for _ in range(frames - 1)]
    await database_sync_to_async(gone.delete)()  # by the operator, as the frames wait to be written
    writer = TelemetryWriter()
    with caplog.at_level(logging.DEBUG):
        for batch in batches:
            await writer.submit(batch)
        await writer.flush()
    devices, engines = await stored()
    assert devices == [("gpu-b", 0), ("gpu-b", 1), *sorted([("gpu-c", 0), ("gpu-c", 1)] * (frames - 1))]
    assert engines == [kept.pk] * (frames - 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_it_stores_a_frame_whose_device_was_deleted_meanwhile_without_it(
    agent_host: AgentHost, served_model: ServedModel, caplog: pytest.LogCaptureFixture
) -> None:
    a, deployment = await linked_host("gpu-b", served_model)
    batch = rows_for(a, frame_of(deployment))
    await database_sync_to_async(Device.objects.filter(host_id=a.host_id, index=1).delete)()
    writer = TelemetryWriter()
    await writer.submit(batch)
    await writer.flush()
    assert await stored() == ([("gpu-b", 0)], [deployment.pk])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
