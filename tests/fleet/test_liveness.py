"""Host liveness: heartbeats keep a host online; silence makes it stale, then offline."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from agents import sweeper
from agents.tasks import sweep_liveness
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from inventory.models import Host, HostStatus

from config.asgi import application

from .conftest import AgentHost, register_frame

FAST = override_settings(
    AGENTS_SWEEP_IN_ASGI=True,
    AGENTS_SWEEP_INTERVAL_S=0.1,
    AGENTS_DESIRED_POLL_S=60.0,
    HOST_STALE_AFTER_S=1.0,
    HOST_OFFLINE_AFTER_S=2.0,
)


@pytest.mark.django_db
@override_settings(HOST_STALE_AFTER_S=2.5, HOST_OFFLINE_AFTER_S=6.0)
def test_it_sweeps_statuses_from_the_last_heartbeat() -> None:
    now = timezone.now()
    for name, silent_s in (("quiet", 3.0), ("gone", 7.0), ("fine", 1.0)):
        Host.objects.create(
            name=name, status=HostStatus.ONLINE, last_seen_at=now - timedelta(seconds=silent_s)
        )
    assert sweep_liveness() == 2  # the Celery task, called as the worker would
    statuses = dict(Host.objects.values_list("name", "status"))
    assert statuses == {"quiet": HostStatus.STALE, "gone": HostStatus.OFFLINE, "fine": HostStatus.ONLINE}


def close_connection() -> None:
    connection.close()


async def wait_status(host_id: int, status: str, timeout_s: float) -> float:
    start = time.monotonic()
    while True:
        host = await database_sync_to_async(Host.objects.get)(pk=host_id)
        if host.status == status:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, f"host still {host.status}, expected {status}"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_asgi_process_marks_a_silent_host_stale_then_offline(agent_host: AgentHost) -> None:
    with FAST:
        comm = WebsocketCommunicator(
            application, "/ws/agent/", headers=[(b"authorization", f"Bearer {agent_host.token}".encode())]
        )
        try:
            assert (await comm.connect())[0]
            await comm.send_json_to(register_frame())
            await comm.receive_json_from(timeout=5)
            host_id = agent_host.host.pk
            assert (await database_sync_to_async(Host.objects.get)(pk=host_id)).status == HostStatus.ONLINE
            for _ in range(4):  # heartbeats hold it online past the stale threshold (1 s)
                await comm.send_json_to({"v": 1, "type": "heartbeat", "ts": time.time()})
                last_beat = time.monotonic()
                await asyncio.sleep(0.5)
            assert (await database_sync_to_async(Host.objects.get)(pk=host_id)).status == HostStatus.ONLINE
            await comm.disconnect()  # silence from here on
            await wait_status(host_id, HostStatus.STALE, 5.0)
            stale_after = time.monotonic() - last_beat
            await wait_status(host_id, HostStatus.OFFLINE, 5.0)
            offline_after = time.monotonic() - last_beat
            assert 1.0 <= stale_after < 2.0 <= offline_after < 3.5, (stale_after, offline_after)
        finally:
            await sweeper.stop()
            await database_sync_to_async(close_connection)()  # the one the sweeper's thread opened


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_web_process_no_agent_reaches_still_marks_a_silent_host_offline() -> None:
    # A web server restarted while a host's agent was down (or one that agents never reach: a second
    # daphne) got no agent connection, so it never swept: without Celery beat the dead host stayed
    # "online" for good, and the gateway kept routing to it. Serving anything starts the sweep.
    host = await database_sync_to_async(Host.objects.create)(
        name="gone", status=HostStatus.ONLINE, last_seen_at=timezone.now()
    )
    with FAST:
        request = HttpCommunicator(application, "GET", "/api/health/", headers=[(b"host", b"127.0.0.1")])
        try:
            assert (await request.get_response(timeout=30))["status"] == 200
            await wait_status(host.pk, HostStatus.OFFLINE, 5.0)
        finally:
            await sweeper.stop()
            await database_sync_to_async(close_connection)()  # the one the sweeper's thread opened
