"""Dashboard sockets against hostile or broken input: what a browser sends is ignored, and a socket
whose handler raises still stops its polling task and leaves its groups."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from accounts.models import User
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from dashboard.consumers import JobsConsumer, LogConsumer, ModelConsumer, OverviewConsumer, stream_group
from deployments.models import Deployment
from django.test import override_settings
from inventory.models import Device, Host

from tests.dashboard.helpers import GIB, add_device_sample

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


def socket(consumer: Any, user: User, **kwargs: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(consumer.as_asgi(), "/ws/dashboard/")
    communicator.scope["user"] = user
    communicator.scope["url_route"] = {"kwargs": kwargs}
    return communicator


def polling_tasks() -> list[asyncio.Task[Any]]:
    """This loop's live `LiveConsumer._run` tasks (each reads the database every second)."""
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "LiveConsumer._run" and not t.done()
    ]


async def until_polling(count: int) -> None:
    """Until ``count`` sockets poll (a socket starts its task just after its first push)."""
    for _ in range(500):
        if len(polling_tasks()) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(polling_tasks())} polling task(s), expected {count}")


JUNK: list[dict[str, Any]] = [
    {"text_data": "{junk"},
    {"bytes_data": b"\x00\xff"},
    {"text_data": '{"type": "delta", "set": {}}'},  # valid JSON, still nothing a browser may send
]


@pytest.mark.parametrize("kind", ["overview", "jobs", "model", "log"])
async def test_it_ignores_whatever_a_browser_sends(
    viewer_user: User, deployment: Deployment, kind: str
) -> None:
    consumer, kwargs = {
        "overview": (OverviewConsumer, {}),
        "jobs": (JobsConsumer, {}),
        "model": (ModelConsumer, {"pk": deployment.model_id}),
        "log": (LogConsumer, {"pk": deployment.pk}),
    }[kind]
    communicator = socket(consumer, viewer_user, **kwargs)
    assert (await communicator.connect())[0]
    await until_polling(1)
    for message in JUNK:
        await communicator.send_to(**message)
    await asyncio.sleep(0.3)
    assert not communicator.future.done()  # the socket is still served
    assert len(polling_tasks()) == 1
    await communicator.disconnect()
    assert polling_tasks() == []


async def test_a_socket_keeps_pushing_after_junk(viewer_user: User, host: Host) -> None:
    device = await database_sync_to_async(lambda: Device.objects.filter(host=host).first())()
    communicator = socket(OverviewConsumer, viewer_user)
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=5))["type"] == "snapshot"
    for message in JUNK:
        await communicator.send_to(**message)
    await database_sync_to_async(add_device_sample)(device, memory_used_bytes=33 * GIB)
    delta = await communicator.receive_json_from(timeout=5)
    assert delta["set"][f"device:{device.pk}"]["used"] == 33 * GIB
    await communicator.disconnect()


# The group check reads the in-memory layer's table (the Redis layer keeps groups in Redis): this
# test is about the consumer's clean-up, whichever layer carries the messages in production.
@override_settings(CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}})
@pytest.mark.parametrize("kind", ["overview", "log"])
async def test_a_socket_whose_handler_raises_stops_polling_and_leaves_its_groups(
    viewer_user: User, deployment: Deployment, kind: str
) -> None:
    if kind == "overview":
        communicator, groups = socket(OverviewConsumer, viewer_user), [stream_group("overview")]
    else:
        communicator = socket(LogConsumer, viewer_user, pk=deployment.pk)
        groups = [f"agents.logs.{deployment.pk}"]
    assert (await communicator.connect())[0]
    await until_polling(1)
    layer = get_channel_layer()
    assert all(layer.groups.get(g) for g in groups)
    # A message without a handler makes dispatch raise: daphne would close the socket with 1011
    # and never call disconnect().
    await layer.group_send(groups[0], {"type": "no.such.handler"})
    with pytest.raises(ValueError, match="No handler"):
        await communicator.wait(timeout=5)
    assert polling_tasks() == []
    assert [g for g in groups if layer.groups.get(g)] == []
