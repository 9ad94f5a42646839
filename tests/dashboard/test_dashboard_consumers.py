"""Dashboard websockets through WebsocketCommunicator: auth, snapshots then deltas, 1 Hz, fan-out."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from accounts.models import User
from agents.services import agent_group
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from dashboard import snapshots
from dashboard.consumers import (
    CLOSE_GONE,
    JobsConsumer,
    LogConsumer,
    ModelConsumer,
    OverviewConsumer,
    stream_group,
)
from dashboard.routing import websocket_urlpatterns
from deployments.models import Deployment
from django.test import Client
from django.utils import timezone
from inventory.models import Device, Host
from jobs.models import Job, JobStatus
from registry.models import ServedModel

from config.asgi import application
from tests.dashboard.helpers import GIB, add_device_sample, add_engine_sample

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


ORIGIN = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]


def socket(consumer: Any, path: str, user: User | None, **kwargs: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(consumer.as_asgi(), path)
    communicator.scope["user"] = user
    communicator.scope["url_route"] = {"kwargs": kwargs}
    return communicator


async def log_socket(user: User, deployment: Deployment) -> tuple[Any, str, WebsocketCommunicator, Any]:
    """A connected log socket of ``deployment``, with a channel in its agent's group standing in
    for the agent: (the layer, that channel, the socket, the first command the agent got)."""
    layer = get_channel_layer()
    agent = await layer.new_channel()
    await layer.group_add(agent_group(deployment.host_id), agent)
    communicator = socket(LogConsumer, "/ws/dashboard/deployments/x/logs/", user, pk=deployment.pk)
    assert (await communicator.connect())[0]
    return layer, agent, communicator, await asyncio.wait_for(layer.receive(agent), timeout=5)


async def test_it_refuses_anonymous_sockets_through_the_real_asgi_stack() -> None:
    for path in ("/ws/dashboard/overview/", "/ws/dashboard/jobs/"):
        communicator = WebsocketCommunicator(application, path, headers=ORIGIN)
        connected, _ = await communicator.connect()
        assert not connected, path


async def test_it_refuses_inactive_users() -> None:
    nobody = await database_sync_to_async(User.objects.create_user)(
        "eve", password="x", role="viewer", is_active=False
    )
    communicator = socket(OverviewConsumer, "/ws/dashboard/overview/", nobody)
    connected, _ = await communicator.connect()
    assert not connected
    await communicator.wait()  # the consumer has ended (it waits on the channel layer until closed)


async def test_it_sends_a_snapshot_then_only_the_cards_that_changed(viewer_user: User, host: Host) -> None:
    d0, d1 = await database_sync_to_async(lambda: list(Device.objects.filter(host=host).order_by("index")))()
    await database_sync_to_async(add_device_sample)(d0)
    await database_sync_to_async(add_device_sample)(d1)
    communicator = socket(OverviewConsumer, "/ws/dashboard/overview/", viewer_user)
    assert (await communicator.connect())[0]
    first = await communicator.receive_json_from(timeout=5)
    assert first["type"] == "snapshot"
    assert {f"host:{host.pk}", f"device:{d0.pk}", f"device:{d1.pk}"} <= set(first["data"])
    assert await communicator.receive_nothing(timeout=1.5)  # nothing changed, nothing sent

    await database_sync_to_async(add_device_sample)(
        d1, aqua_role="consumer", borrowed_bytes=5 * GIB, paired_with=0
    )
    delta = await communicator.receive_json_from(timeout=5)
    assert delta["type"] == "delta" and delta["remove"] == []
    assert list(delta["set"]) == [f"device:{d1.pk}"]
    assert delta["set"][f"device:{d1.pk}"]["borrowed"] == 5 * GIB
    await communicator.disconnect()


async def test_it_pushes_each_series_at_most_once_a_second(viewer_user: User, host: Host) -> None:
    device = await database_sync_to_async(lambda: Device.objects.filter(host=host).first())()
    communicator = socket(OverviewConsumer, "/ws/dashboard/overview/", viewer_user)
    assert (await communicator.connect())[0]
    await communicator.receive_json_from(timeout=5)
    layer = get_channel_layer()
    arrivals: list[float] = []

    async def change_often() -> None:
        # A new sample and a wake-up every 0.1 s: ten times faster than the socket may push.
        for step in range(40):
            await database_sync_to_async(add_device_sample)(device, memory_used_bytes=(step + 1) * GIB)
            await layer.group_send(stream_group("overview"), {"type": "dashboard.changed"})
            await asyncio.sleep(0.1)

    writer = asyncio.create_task(change_often())
    while not writer.done():
        # receive_nothing polls without a deadline (a receive that times out cancels the consumer).
        if await communicator.receive_nothing(timeout=0.02, interval=0.005):
            continue
        arrivals.append(time.monotonic())
        assert (await communicator.receive_json_from())["type"] == "delta"
    await writer
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) >= 3, arrivals
    assert min(gaps) >= 0.9, gaps  # 1 s apart, give or take this loop's polling
    await communicator.disconnect()


async def test_a_change_fans_out_to_every_socket_of_the_stream(viewer_user: User, admin_user: User) -> None:
    sockets = [socket(JobsConsumer, "/ws/dashboard/jobs/", user) for user in (viewer_user, admin_user)]
    for communicator in sockets:
        assert (await communicator.connect())[0]
        assert (await communicator.receive_json_from(timeout=5))["data"] == {}
    job = await database_sync_to_async(Job.objects.create)(
        kind="noop", status=JobStatus.RUNNING, progress=0.5
    )
    await get_channel_layer().group_send(stream_group("jobs"), {"type": "dashboard.changed"})
    for communicator in sockets:
        delta = await communicator.receive_json_from(timeout=5)
        assert delta["set"][f"job:{job.pk}"]["progress"] == 0.5
        assert delta["set"][f"job:{job.pk}"]["status"] == "running"
        await communicator.disconnect()


async def test_it_pushes_only_new_engine_samples_and_the_attainment(
    viewer_user: User, deployment: Deployment
) -> None:
    now = timezone.now()
    await database_sync_to_async(add_engine_sample)(deployment, now - timedelta(seconds=2))
    communicator = socket(ModelConsumer, "/ws/dashboard/models/x/", viewer_user, pk=deployment.model_id)
    assert (await communicator.connect())[0]
    first = await communicator.receive_json_from(timeout=5)
    assert first["type"] == "points" and len(first["points"]) == 1
    summary = await communicator.receive_json_from(timeout=5)
    states = {str(deployment.pk): deployment.observed_state}
    assert summary == {
        "type": "summary",
        "set": {"attainment": 100.0, "windows": 1, "deployments": states},
        "remove": [],
    }

    await database_sync_to_async(add_engine_sample)(deployment, now - timedelta(seconds=1), itl_p99=0.2)
    points = await communicator.receive_json_from(timeout=5)
    assert points["deployment"] == deployment.pk
    assert [p["tbt_p99"] for p in points["points"]] == [0.2]  # the new sample only
    summary = await communicator.receive_json_from(timeout=5)
    assert summary["set"]["attainment"] == 50.0  # 200 ms TBT misses the 50 ms SLO
    await communicator.disconnect()


async def test_it_refuses_a_socket_for_an_unknown_model(viewer_user: User) -> None:
    communicator = socket(ModelConsumer, "/ws/dashboard/models/x/", viewer_user, pk=999)
    assert not (await communicator.connect())[0]


async def test_it_asks_the_agent_for_the_log_tail_and_relays_its_answer(
    viewer_user: User, deployment: Deployment
) -> None:
    layer, _, communicator, command = await log_socket(viewer_user, deployment)
    assert command["type"] == "agent.command"
    assert command["frame"]["action"] == "tail_log"
    assert command["frame"]["deployment_id"] == str(deployment.pk)
    lines = ["INFO engine started", "INFO 3 requests"]
    await layer.group_send(
        f"agents.logs.{deployment.pk}",
        {"type": "log.tail", "deployment_id": str(deployment.pk), "lines": lines},
    )
    message = await communicator.receive_json_from(timeout=5)
    assert message == {"type": "log", "deployment": deployment.pk, "lines": lines}
    await communicator.disconnect()


async def test_a_job_page_streams_its_job_even_when_newer_jobs_fill_the_list(
    viewer_user: User, viewer_client: Client
) -> None:
    old = await database_sync_to_async(Job.objects.create)(kind="noop", status=JobStatus.RUNNING)
    await database_sync_to_async(Job.objects.bulk_create)(
        [Job(kind="noop", status=JobStatus.QUEUED) for _ in range(snapshots.JOBS_SHOWN)]
    )
    page = await database_sync_to_async(viewer_client.get)(f"/jobs/{old.pk}/")
    path = re.search(r'data-socket="([^"]+)"', page.content.decode())[1]  # type: ignore[index]
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = viewer_user
    assert (await communicator.connect())[0]
    first = await communicator.receive_json_from(timeout=5)
    assert first["data"][f"job:{old.pk}"]["status"] == "running"

    def finish() -> None:
        Job.objects.filter(pk=old.pk).update(status=JobStatus.SUCCEEDED, progress=1.0)

    await database_sync_to_async(finish)()
    await get_channel_layer().group_send(stream_group("jobs"), {"type": "dashboard.changed"})
    delta = await communicator.receive_json_from(timeout=5)
    assert delta["set"][f"job:{old.pk}"]["status"] == "succeeded"  # the page reloads on this
    await communicator.disconnect()


async def test_a_log_socket_closes_and_stops_asking_the_agent_once_its_deployment_is_deleted(
    viewer_user: User, deployment: Deployment
) -> None:
    layer, agent, communicator, command = await log_socket(viewer_user, deployment)
    assert command["frame"]["action"] == "tail_log"

    await database_sync_to_async(Deployment.objects.filter(pk=deployment.pk).delete)()
    closing = await communicator.receive_output(timeout=5)
    assert closing == {"type": "websocket.close", "code": CLOSE_GONE}
    # Before: a tail_log for the deleted deployment every second, each answered by the agent with
    # an `unknown_deployment` error, for as long as the page stayed open.
    with contextlib.suppress(TimeoutError):  # one sent as the deployment went
        await asyncio.wait_for(layer.receive(agent), timeout=0.5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(agent), timeout=2.5)
    await communicator.disconnect()


async def test_a_model_socket_closes_once_its_model_is_deleted(
    viewer_user: User, served_model: ServedModel
) -> None:
    communicator = socket(ModelConsumer, "/ws/dashboard/models/x/", viewer_user, pk=served_model.pk)
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=5))["type"] == "summary"

    await database_sync_to_async(served_model.delete)()
    # Before: the socket read the (empty) deployments of the deleted model every second, and its
    # page stayed "live" for as long as it was open.
    closing = await communicator.receive_output(timeout=5)
    assert closing == {"type": "websocket.close", "code": CLOSE_GONE}
    await communicator.disconnect()
