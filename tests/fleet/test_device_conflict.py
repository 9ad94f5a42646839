"""A `register` reporting a device another host registered (two agents on one machine that both
report its CPU, or both see one GPU) is refused with a message naming the other host, and the link
is closed (4422), so the agent backs off instead of sending frames that are all refused. It was a
bare "UNIQUE constraint failed: inventory_device.uuid" bad frame and the link kept, after which
every heartbeat and telemetry frame was answered `not_registered`, forever."""

from __future__ import annotations

from typing import Any

import pytest
from agents import services
from agents.models import AgentLink
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import IntegrityError
from django.test import override_settings
from inventory.models import Device
from inventory.services import issue_agent_token, register_host

from config.asgi import application
from gpu_agent.protocol import CLOSE_REGISTER_REFUSED

from .conftest import AgentHost, register_frame

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]
NO_SWEEP = override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0)


def communicator(token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )


@database_sync_to_async
def second_host() -> str:
    host = register_host("gpu-b", "10.0.0.6")
    return issue_agent_token(host).plaintext


@database_sync_to_async
def devices_of(name: str) -> list[tuple[int, str]]:
    return list(Device.objects.filter(host__name=name).order_by("index").values_list("index", "uuid"))


def claiming(frame: dict[str, Any], uuid: str) -> dict[str, Any]:
    """`frame` with its device 1 reporting `uuid`."""
    frame["devices"][1]["uuid"] = uuid
    return frame


async def test_a_device_of_another_host_is_refused_with_a_clear_reason_and_the_link_closed(
    agent_host: AgentHost,
) -> None:
    token_b = await second_host()
    with NO_SWEEP:
        first = communicator(agent_host.token)
        assert (await first.connect())[0]
        await first.send_json_to(register_frame())
        assert (await first.receive_json_from(timeout=5))["type"] == "desired_deployments"

        second = communicator(token_b)
        assert (await second.connect())[0]
        await second.send_json_to(claiming(register_frame(host="gpu-b"), "GPU-gpu-a-0"))
        error = await second.receive_json_from(timeout=5)
        assert (error["type"], error["code"], error["field"]) == ("error", "register_refused", "devices")
        message = error["message"]
        assert "device 1" in message and "'GPU-gpu-a-0'" in message, message
        assert "already registered by host 'gpu-a' as its device 0" in message, message
        await second.send_json_to({"v": 1, "type": "heartbeat", "ts": 1.0})  # dropped: it is closing
        assert (await second.receive_output(timeout=5)) == {
            "type": "websocket.close",
            "code": CLOSE_REGISTER_REFUSED,
        }
        # Nothing of the refused register was stored, and the first host keeps its devices.
        assert await devices_of("gpu-b") == []
        assert await devices_of("gpu-a") == [(0, "GPU-gpu-a-0"), (1, "GPU-gpu-a-1")]
        link_b = await database_sync_to_async(AgentLink.objects.filter(host__name="gpu-b").first)()
        assert link_b is None or not link_b.connected
        await first.disconnect()


async def test_a_register_the_database_refuses_closes_the_link(
    agent_host: AgentHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise IntegrityError("UNIQUE constraint failed: inventory_device.uuid")

    monkeypatch.setattr(services, "register", refuse)  # another host took a uuid meanwhile
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        error = await comm.receive_json_from(timeout=5)
        assert (error["code"], error["field"]) == ("register_refused", "devices")
        assert error["message"] == "cannot store the devices: UNIQUE constraint failed: inventory_device.uuid"
        assert (await comm.receive_output(timeout=5)) == {
            "type": "websocket.close",
            "code": CLOSE_REGISTER_REFUSED,
        }
        link = await database_sync_to_async(AgentLink.objects.filter(host=agent_host.host).first)()
        assert link is None or link.frames_rejected == 1
