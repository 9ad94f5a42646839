"""Hosts and devices are read-only over the API; agent tokens authenticate hosts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from inventory.models import Device, Host, HostStatus
from inventory.services import (
    authenticate_agent,
    issue_agent_token,
    refresh_statuses,
    register_host,
    status_at,
)
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu_host() -> Host:
    host = register_host("gpu-a", "10.0.0.5:9000")
    for index in range(2):
        Device.objects.create(
            host=host,
            index=index,
            uuid=f"GPU-{index}",
            name="H100",
            memory_total_bytes=80 << 30,
            nvlink_peers=[1 - index],
        )
    return host


def test_it_lists_hosts_with_their_devices(viewer_client: APIClient, gpu_host: Host) -> None:
    response = viewer_client.get("/api/v1/hosts/")
    assert response.status_code == 200
    (host,) = response.data["results"]
    assert host["name"] == "gpu-a"
    assert [d["uuid"] for d in host["devices"]] == ["GPU-0", "GPU-1"]
    assert host["devices"][0]["nvlink_peers"] == [1]

    devices = viewer_client.get("/api/v1/devices/", {"host": "gpu-a"})
    assert [d["index"] for d in devices.data["results"]] == [0, 1]
    assert viewer_client.get("/api/v1/devices/", {"host": "other"}).data["results"] == []


def test_a_host_filter_holding_a_nul_is_a_400_naming_it(viewer_client: APIClient, gpu_host: Host) -> None:
    # PostgreSQL text cannot hold NUL: the lookup was a 500 (DataError) there.
    for value in ("\x00", "gpu-a\x00"):
        response = viewer_client.get("/api/v1/devices/", {"host": value})
        assert response.status_code == 400, response.content
        assert response.json() == {"host": ["Null characters are not allowed."]}
    assert viewer_client.get("/api/v1/devices/?host=gpu-a%00").status_code == 400


def test_it_refuses_writes_to_hosts(
    admin_client: APIClient, viewer_client: APIClient, gpu_host: Host
) -> None:
    assert admin_client.post("/api/v1/hosts/", {"name": "x"}, format="json").status_code == 405
    assert admin_client.delete(f"/api/v1/hosts/{gpu_host.pk}/").status_code == 405
    assert viewer_client.post("/api/v1/hosts/", {"name": "x"}, format="json").status_code == 403
    assert list(Host.objects.values_list("name", flat=True)) == ["gpu-a"]


def test_it_authenticates_agents_by_their_latest_token_only(gpu_host: Host) -> None:
    first = issue_agent_token(gpu_host)
    assert authenticate_agent(first.plaintext) == gpu_host
    second = issue_agent_token(gpu_host)
    assert authenticate_agent(second.plaintext) == gpu_host
    assert authenticate_agent(first.plaintext) is None
    assert authenticate_agent("agt_forged") is None
    assert first.plaintext not in first.record.digest


def test_it_derives_host_status_from_the_last_heartbeat(gpu_host: Host) -> None:
    now = timezone.now()
    assert status_at(None, now) == HostStatus.OFFLINE
    assert status_at(now - timedelta(seconds=1), now) == HostStatus.ONLINE
    assert status_at(now - timedelta(seconds=5), now) == HostStatus.STALE  # 2 heartbeats missed
    assert status_at(now - timedelta(seconds=29), now) == HostStatus.STALE
    assert status_at(now - timedelta(seconds=300), now) == HostStatus.OFFLINE

    Host.objects.filter(pk=gpu_host.pk).update(
        status=HostStatus.ONLINE, last_seen_at=now - timedelta(seconds=30)
    )
    assert refresh_statuses(now) == 1
    gpu_host.refresh_from_db()
    assert gpu_host.status == HostStatus.STALE
    assert refresh_statuses(now) == 0
