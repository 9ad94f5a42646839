"""Chart endpoints: host telemetry and deployment metrics since an instant, raw or per minute."""

from __future__ import annotations

from datetime import timedelta

import pytest
from agents.models import DeviceMinute, DeviceSample, EngineSample, Replica
from deployments.models import Deployment
from django.utils import timezone
from inventory.models import Device, Host
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def host() -> Host:
    host = Host.objects.create(name="gpu-a", address="10.0.0.5")
    for i in range(2):
        Device.objects.create(host=host, index=i, uuid=f"GPU-{i}", name="H100", memory_total_bytes=80 << 30)
    return host


def add_samples(device: Device, ages_s: list[float]) -> None:
    now = timezone.now()
    for age in ages_s:
        DeviceSample.objects.create(
            device=device,
            ts=now - timedelta(seconds=age),
            memory_used_bytes=int(age) << 20,
            memory_free_bytes=1,
            utilization_pct=age,
        )


def test_it_returns_raw_samples_since_an_instant(viewer_client: APIClient, host: Host) -> None:
    d0, d1 = host.devices.order_by("index")
    add_samples(d0, [200, 30, 20, 10])
    add_samples(d1, [15])
    since = (timezone.now() - timedelta(seconds=60)).isoformat()
    response = viewer_client.get(f"/api/v1/hosts/{host.pk}/telemetry/", {"since": since})
    assert response.status_code == 200, response.data
    assert response.data["resolution"] == "raw"
    devices = response.data["devices"]
    assert [d["index"] for d in devices] == [0, 1]
    assert [s["utilization_pct"] for s in devices[0]["samples"]] == [30, 20, 10]  # oldest first
    assert [s["utilization_pct"] for s in devices[1]["samples"]] == [15]


def test_it_serves_minutes_from_stored_and_not_yet_folded_samples(
    viewer_client: APIClient, host: Host
) -> None:
    d0 = host.devices.get(index=0)
    two_hours_ago = (timezone.now() - timedelta(hours=2)).replace(second=0, microsecond=0)
    DeviceMinute.objects.create(
        device=d0,
        minute=two_hours_ago,
        samples=60,
        memory_used_bytes=7,
        memory_used_max_bytes=9,
        memory_free_bytes=1,
        utilization_pct=42.0,
    )
    add_samples(d0, [5])
    since = (two_hours_ago - timedelta(minutes=1)).timestamp()  # epoch seconds are accepted too
    response = viewer_client.get(f"/api/v1/hosts/{host.pk}/telemetry/", {"since": since})
    assert response.status_code == 200, response.data
    assert response.data["resolution"] == "minute"
    points = response.data["devices"][0]["samples"]
    assert [(p["samples"], p["utilization_pct"]) for p in points] == [(60, 42.0), (1, 5.0)]


def test_it_rejects_a_bad_query(viewer_client: APIClient, host: Host) -> None:
    url = f"/api/v1/hosts/{host.pk}/telemetry/"
    bad_since = viewer_client.get(url, {"since": "yesterday"})
    assert bad_since.status_code == 400 and "since" in bad_since.data
    future = viewer_client.get(url, {"since": (timezone.now() + timedelta(hours=1)).isoformat()})
    assert future.status_code == 400 and "since" in future.data
    bad_resolution = viewer_client.get(url, {"resolution": "hourly"})
    assert bad_resolution.status_code == 400 and "resolution" in bad_resolution.data


def test_it_needs_authentication_and_an_existing_host(
    anon_client: APIClient, viewer_client: APIClient, host: Host
) -> None:
    assert anon_client.get(f"/api/v1/hosts/{host.pk}/telemetry/").status_code == 401
    assert viewer_client.get(f"/api/v1/hosts/{host.pk + 100}/telemetry/").status_code == 404
    assert viewer_client.post(f"/api/v1/hosts/{host.pk}/telemetry/").status_code == 403  # viewers read only


def test_it_returns_a_deployments_metrics_and_replica(viewer_client: APIClient, host: Host) -> None:
    model = ServedModel.objects.create(
        name="m", source="/m", max_context_length=128, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    deployment = Deployment.objects.create(model=model, host=host)
    other = Deployment.objects.create(model=model, host=host)
    now = timezone.now()
    for dep, p99 in ((deployment, 0.2), (other, 9.0)):
        EngineSample.objects.create(deployment=dep, ts=now, state="running", ttft_count=2, ttft_p99=p99)
    Replica.objects.create(
        deployment=deployment,
        state="running",
        restarts=1,
        port=8001,
        base_url="http://10.0.0.5:8001",
        reported_at=now,
    )
    response = viewer_client.get(f"/api/v1/deployments/{deployment.pk}/metrics/")
    assert response.status_code == 200, response.data
    assert [s["ttft_p99"] for s in response.data["samples"]] == [0.2]
    assert response.data["replica"]["base_url"] == "http://10.0.0.5:8001"
    assert response.data["replica"]["restarts"] == 1
    assert viewer_client.get(f"/api/v1/deployments/{other.pk + 100}/metrics/").status_code == 404
    # The deployments API itself still answers at its own detail URL.
    assert viewer_client.get(f"/api/v1/deployments/{deployment.pk}/").status_code == 200
