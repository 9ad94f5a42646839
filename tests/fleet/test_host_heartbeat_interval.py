"""Liveness counts the heartbeat interval an agent registered: an agent beating every 5 s is not
stale between two beats (the gateway routes only to online hosts), one that says nothing keeps the
1 s default, and a slow agent's host is never called offline while it would still be online."""

from __future__ import annotations

from datetime import timedelta

import pytest
from agents.reconcile import sweep
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from django.utils import timezone
from inventory.models import Host, HostStatus

from config.asgi import application

from .conftest import AgentHost, register_frame

LIVENESS = override_settings(HOST_STALE_AFTER_S=2.5, HOST_OFFLINE_AFTER_S=30.0)


@pytest.mark.django_db
@LIVENESS
def test_it_waits_two_and_a_half_registered_beats_before_calling_a_host_stale() -> None:
    now = timezone.now()
    hosts = {
        # name: (registered interval, silent for) -> expected status
        "default-fine": (None, 2.4),
        "default-stale": (None, 3.0),
        "fast-agent": (0.5, 2.4),  # HOST_STALE_AFTER_S is the floor
        "five-s-between-beats": (5.0, 4.9),
        "five-s-two-missed": (5.0, 12.0),
        "five-s-stale": (5.0, 13.0),
        "five-s-offline": (5.0, 31.0),
        "minute-beats-online": (60.0, 100.0),  # past HOST_OFFLINE_AFTER_S, but within 2.5 beats
        "minute-beats-offline": (60.0, 151.0),
    }
    for name, (interval, silent_s) in hosts.items():
        Host.objects.create(
            name=name,
            status=HostStatus.ONLINE,
            heartbeat_interval_s=interval,
            last_seen_at=now - timedelta(seconds=silent_s),
        )
    sweep(now)
    assert dict(Host.objects.values_list("name", "status")) == {
        "default-fine": HostStatus.ONLINE,
        "default-stale": HostStatus.STALE,
        "fast-agent": HostStatus.ONLINE,
        "five-s-between-beats": HostStatus.ONLINE,
        "five-s-two-missed": HostStatus.ONLINE,
        "five-s-stale": HostStatus.STALE,
        "five-s-offline": HostStatus.OFFLINE,
        "minute-beats-online": HostStatus.ONLINE,
        "minute-beats-offline": HostStatus.OFFLINE,
    }


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_register_stores_the_agents_interval_and_an_older_agent_keeps_the_default(
    agent_host: AgentHost,
) -> None:
    headers = [(b"authorization", f"Bearer {agent_host.token}".encode())]
    with LIVENESS, override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        for announced, stored in ((5, 5.0), (None, None)):
            comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
            assert (await comm.connect())[0]
            frame = register_frame()
            if announced is not None:
                frame["heartbeat_interval_s"] = announced
            await comm.send_json_to(frame)
            assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
            host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
            assert host.heartbeat_interval_s == stored
            # 4.9 s after the last beat: online for the 5 s agent, stale for a 1 s one.
            assert host.last_seen_at is not None
            await database_sync_to_async(sweep)(host.last_seen_at + timedelta(seconds=4.9))
            host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
            assert host.status == (HostStatus.ONLINE if announced else HostStatus.STALE)
            await comm.disconnect()

        comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        assert (await comm.connect())[0]
        await comm.send_json_to({**register_frame(), "heartbeat_interval_s": 600})
        answer = await comm.receive_json_from(timeout=5)
        assert (answer["type"], answer["field"]) == ("error", "heartbeat_interval_s")
        await comm.disconnect()
