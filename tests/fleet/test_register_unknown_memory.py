"""A unified-memory GPU (NVIDIA GB10, a DGX Spark) as the agent reports it, memory unknown: 0 bytes
in `register`, 0 used and 0 free in `telemetry`. The control plane stores the device and its
samples (the agent used to register no device at all for such a host)."""

from __future__ import annotations

import time

import pytest
from agents.ingest import writer
from agents.models import DeviceSample
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from inventory.models import Device

from config.asgi import application
from gpu_agent.inventory import NvmlInventory
from gpu_agent.protocol import Register, Telemetry, dumps
from tests.agent.fake_nvml import FakeGpu, FakeNvml

from .conftest import AgentHost

NOT_SUPPORTED = 3


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_gpu_of_unknown_memory_is_registered_and_its_samples_stored(agent_host: AgentHost) -> None:
    spark = FakeGpu("0000000F:01:00.0", name="NVIDIA GB10", errors={"nvmlDeviceGetMemoryInfo": NOT_SUPPORTED})
    inventory = NvmlInventory(FakeNvml([spark]))
    register = Register("gpu-a", "10.0.0.5", "0.1.0", False, inventory.describe())
    headers = [(b"authorization", f"Bearer {agent_host.token}".encode())]
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        assert (await comm.connect())[0]
        await comm.send_to(text_data=dumps(register))
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        await comm.send_to(text_data=dumps(Telemetry(ts=time.time(), devices=inventory.sample())))
        assert await comm.receive_nothing(timeout=0.3)  # no error frame
        await writer().flush()
        await comm.disconnect()
    rows = await database_sync_to_async(
        lambda: list(Device.objects.values_list("name", "memory_total_bytes"))
    )()
    assert rows == [("NVIDIA GB10", 0)]
    samples = await database_sync_to_async(
        lambda: list(
            DeviceSample.objects.values_list("memory_used_bytes", "memory_free_bytes", "utilization_pct")
        )
    )()
    assert samples == [(0, 0, 40.0)]
