"""The real ASGI server (daphne) and a real agent process (`python -m gpu_agent`) over a real websocket.

On this machine the agent finds no NVIDIA driver and reports the CPU as its one device.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from accounts.models import Role, User
from accounts.services import issue_api_token
from agents.models import AgentLink, DeviceSample
from django.utils import timezone
from inventory.models import Device, DeviceKind, Host, HostStatus
from inventory.services import issue_agent_token, register_host
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from .servers import AgentProcess, AsgiServer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Stale after 2 missed heartbeats (agents beat every second); offline soon after, to keep it short.
LIVENESS = {"HOST_STALE_AFTER_S": "2.5", "HOST_OFFLINE_AFTER_S": "6"}


@pytest.fixture
def server() -> Iterator[AsgiServer]:
    server = AsgiServer(**LIVENESS)
    server.start()
    yield server
    server.stop()


def host_status(name: str) -> str:
    return str(Host.objects.get(name=name).status)


def silent_s(name: str) -> float:
    """Seconds since the host's last stored heartbeat."""
    last_seen = Host.objects.get(name=name).last_seen_at
    assert last_seen is not None
    return (timezone.now() - last_seen).total_seconds()


def test_an_agent_registers_streams_telemetry_and_goes_stale_then_offline_when_killed(
    server: AsgiServer, tmp_path: Path
) -> None:
    host = register_host("it-host")
    token = issue_agent_token(host).plaintext
    agent = AgentProcess(server.url, token, "it-host", tmp_path / "agent")
    agent.start()
    try:
        wait_until(lambda: Device.objects.filter(host=host).exists(), 60, "the agent to register")
        host.refresh_from_db()
        device = Device.objects.get(host=host)
        assert (host.status, host.address, host.simulated) == (HostStatus.ONLINE, "127.0.0.1", False)
        assert device.kind == DeviceKind.CPU and device.memory_total_bytes > 0
        assert AgentLink.objects.get(host=host).connected

        # Telemetry every second, by the agent's sample times (how soon each frame is stored
        # depends on how busy this machine is, and is no part of the cadence).
        samples = DeviceSample.objects.filter(device=device)
        wait_until(lambda: samples.count() >= 5, 30, "five telemetry samples")
        stamps = list(samples.order_by("ts").values_list("ts", flat=True))
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
        assert 0.8 <= statistics.median(gaps) <= 1.2, gaps
        assert all(s.memory_used_bytes > 0 and s.memory_free_bytes > 0 for s in samples)

        # The chart endpoint of the running server serves them.
        viewer = User.objects.create_user(username="viewer", password="viewer-pw-9f2k", role=Role.VIEWER)
        request = urllib.request.Request(
            f"{server.url}/api/v1/hosts/{host.pk}/telemetry/",
            headers={"Authorization": f"Token {issue_api_token(viewer, 'it').plaintext}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.load(response)
        assert body["devices"][0]["kind"] == "cpu" and len(body["devices"][0]["samples"]) >= 4

        agent.kill()
        stale_s = wait_until(lambda: host_status("it-host") != HostStatus.ONLINE, 10, "the host to go stale")
        stale_silent_s = silent_s("it-host")
        assert host_status("it-host") == HostStatus.STALE
        wait_until(lambda: host_status("it-host") == HostStatus.OFFLINE, 15, "offline")
        offline_silent_s = silent_s("it-host")
        # Measured from the last heartbeat stored, not from the kill: an agent slowed down by a busy
        # machine may have sent it more than a second before it was killed.
        stale_after, offline_after = (
            float(LIVENESS[k]) for k in ("HOST_STALE_AFTER_S", "HOST_OFFLINE_AFTER_S")
        )
        assert stale_silent_s >= stale_after, stale_silent_s  # > 2 missed heartbeats ...
        assert stale_s <= 5.0, stale_s  # ... and noticed within the sweep's second
        assert offline_silent_s >= offline_after, offline_silent_s
        assert not AgentLink.objects.get(host=host).connected
    finally:
        agent.stop()


def test_it_refuses_a_wrong_token_at_the_handshake(server: AsgiServer) -> None:
    register_host("it-host")

    async def handshake(token: str) -> int:
        try:
            async with connect(
                server.url.replace("http", "ws") + "/ws/agent/",
                additional_headers={"Authorization": f"Bearer {token}"},
            ):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    assert asyncio.run(handshake("agt_wrong")) == 403
    token = issue_agent_token(Host.objects.get(name="it-host")).plaintext
    assert asyncio.run(handshake(token)) == 101
