"""An operator deletes a host (in the admin) while its agent is connected: the frames the agent
sends before its connection notices (its token went with the host) are dropped, and the consumer
keeps answering until it closes the link. A heartbeat re-read the deleted host and raised
(Host.DoesNotExist), which ended the connection with 1011 and an "Exception inside application"."""

from __future__ import annotations

import logging

import pytest
from agents.models import DeviceSample
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from inventory.models import Host

from .conftest import device_sample, telemetry_frame
from .test_agent_consumer import link, until  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


async def test_it_drops_the_frames_of_a_deleted_host_and_keeps_answering(
    link: WebsocketCommunicator,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    await database_sync_to_async(Host.objects.filter(name="gpu-a").delete)()
    await link.send_json_to({"v": 1, "type": "heartbeat", "ts": 1.0e9})
    await link.send_json_to(telemetry_frame([device_sample(0), device_sample(1)]))
    status = {"v": 1, "type": "deployment_status", "deployment_id": "1", "state": "stopped", "ts": 1.0e9}
    await link.send_json_to(status)

    error = await link.receive_json_from(timeout=5)  # answered: the consumer still runs
    assert (error["type"], error["code"], error["field"]) == ("error", "unknown_deployment", "deployment_id")
    assert not await database_sync_to_async(Host.objects.exists)()
    await until(lambda: not DeviceSample.objects.exists(), "nothing stored")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
