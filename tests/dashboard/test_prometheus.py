"""GET /api/v1/metrics/: the fleet in Prometheus' text format, read as Prometheus reads it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from accounts.models import User
from accounts.services import issue_api_token
from agents.models import AquaRole
from deployments.models import Deployment
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from inventory.models import Device, DeviceKind, Host, HostStatus
from jobs.models import Job, JobStatus
from prometheus_client.parser import text_string_to_metric_families
from registry.models import ServedModel

from tests.dashboard.helpers import GIB, add_device_sample, add_engine_sample

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: Client, token: str = "") -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = client.get("/api/v1/metrics/", headers=headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


def test_it_needs_an_api_token_or_a_session_and_takes_a_bearer_token(viewer_user: User) -> None:
    assert Client().get("/api/v1/metrics/").status_code == 401
    token = issue_api_token(viewer_user, "prometheus").plaintext
    assert ("llmp_host_up", labels(host="x")) not in scrape(Client(), token)
    viewer_user.is_active = False  # a deactivated user's tokens stop working
    viewer_user.save()
    assert Client().get("/api/v1/metrics/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401


def test_it_reports_what_the_dashboard_shows(
    viewer_client: Client, host: Host, deployment: Deployment, served_model: ServedModel
) -> None:
    host.status = HostStatus.ONLINE
    host.save()
    Host.objects.create(name="gone", status=HostStatus.OFFLINE)
    gpu0, gpu1 = Device.objects.filter(host=host).order_by("index")
    now = timezone.now()
    add_device_sample(gpu0, now, utilization_pct=50.0, aqua_role=AquaRole.CONSUMER, borrowed_bytes=4 * GIB)
    add_device_sample(gpu1, now, aqua_role=AquaRole.PRODUCER, lent_bytes=4 * GIB)
    unified = Device.objects.create(
        host=host, index=2, uuid="GPU-gb10", name="GB10", kind=DeviceKind.GPU, memory_total_bytes=0
    )
    # Three windows of the last minute, one missing the 500 ms TTFT SLO; one too old to count.
    add_engine_sample(deployment, now - timedelta(minutes=5), ttft_p99=9.0)
    add_engine_sample(deployment, now - timedelta(seconds=3), ttft_p99=0.9)
    add_engine_sample(deployment, now - timedelta(seconds=2))
    add_engine_sample(
        deployment, now - timedelta(seconds=1), running=3, waiting=2, kv_cache_usage=0.75, preemptions_total=7
    )
    Job.objects.create(kind="profile", status=JobStatus.SUCCEEDED)
    Job.objects.create(kind="profile", status=JobStatus.SUCCEEDED)

    got = scrape(viewer_client)
    assert got[("llmp_host_up", labels(host="sim-a"))] == 1.0
    assert got[("llmp_host_up", labels(host="gone"))] == 0.0
    gpu = {"host": "sim-a", "name": "H100", "kind": "gpu"}
    assert got[("llmp_gpu_memory_total_bytes", labels(**gpu, gpu="0"))] == 80 * GIB
    assert got[("llmp_gpu_memory_used_bytes", labels(**gpu, gpu="0"))] == 10 * GIB
    assert got[("llmp_gpu_memory_borrowed_bytes", labels(**gpu, gpu="0"))] == 4 * GIB
    assert got[("llmp_gpu_memory_lent_bytes", labels(**gpu, gpu="1"))] == 4 * GIB
    assert got[("llmp_gpu_utilization_ratio", labels(**gpu, gpu="0"))] == 0.5
    assert got[("llmp_gpu_aqua_role", labels(**gpu, gpu="1", role="producer"))] == 1.0
    # A GPU without memory of its own (unified memory) reports none, rather than 0 bytes of 0.
    assert ("llmp_gpu_memory_total_bytes", labels(host="sim-a", name="GB10", kind="gpu", gpu="2")) not in got
    assert (
        got[("llmp_gpu_aqua_role", labels(host="sim-a", name="GB10", kind="gpu", gpu="2", role="none"))]
        == 1.0
    )
    assert unified.memory_total_bytes == 0
    # A device never sampled has its size, but no reading of its use (not "0 used, all free").
    spare = Device.objects.create(
        host=host, index=3, uuid="GPU-spare", name="H100", kind=DeviceKind.GPU, memory_total_bytes=80 * GIB
    )
    got = scrape(viewer_client)
    assert got[("llmp_gpu_memory_total_bytes", labels(**gpu, gpu=str(spare.index)))] == 80 * GIB
    assert ("llmp_gpu_memory_free_bytes", labels(**gpu, gpu=str(spare.index))) not in got
    assert ("llmp_gpu_memory_used_bytes", labels(**gpu, gpu=str(spare.index))) not in got

    dep = {"deployment": str(deployment.pk), "model": "tiny"}
    states = {"host": "sim-a", "desired": deployment.desired_state, "observed": deployment.observed_state}
    assert got[("llmp_deployment_info", labels(**dep, **states))] == 1.0
    assert got[("llmp_engine_ttft_seconds", labels(**dep, quantile="0.99"))] == 0.3  # the newest window
    assert got[("llmp_engine_tbt_seconds", labels(**dep, quantile="0.5"))] == 0.01
    assert got[("llmp_engine_requests_running", labels(**dep))] == 3
    assert got[("llmp_engine_requests_waiting", labels(**dep))] == 2
    assert got[("llmp_engine_kv_cache_usage_ratio", labels(**dep))] == 0.75
    assert got[("llmp_engine_preemptions_total", labels(**dep))] == 7
    assert got[("llmp_model_slo_attainment_ratio", labels(model="tiny"))] == pytest.approx(2 / 3, abs=1e-3)
    assert got[("llmp_jobs", labels(kind="profile", status="succeeded"))] == 2


def test_an_engine_that_stopped_reporting_is_not_shown_as_current(
    viewer_client: Client, deployment: Deployment
) -> None:
    add_engine_sample(deployment, timezone.now() - timedelta(minutes=2), running=5)
    got = scrape(viewer_client)
    assert not [key for key in got if key[0].startswith("llmp_engine_")]
    assert ("llmp_model_slo_attainment_ratio", labels(model="tiny")) not in got
    assert ("llmp_deployment_info", labels()) not in got
    assert any(name == "llmp_deployment_info" for name, _ in got)  # the deployment itself is listed


def test_a_scrape_costs_the_same_queries_whatever_the_fleet_size(
    viewer_client: Client, host: Host, deployment: Deployment, served_model: ServedModel
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            scrape(viewer_client)
        return len(seen)

    add_device_sample(Device.objects.get(host=host, index=0))
    add_engine_sample(deployment, timezone.now())
    small = queries()
    for i in range(5):
        other = Host.objects.create(name=f"more-{i}")
        device = Device.objects.create(
            host=other, index=0, uuid=f"GPU-more-{i}", name="L4", memory_total_bytes=GIB
        )
        add_device_sample(device)
        model = ServedModel.objects.create(
            name=f"m{i}",
            source="/m",
            tensor_parallel_size=1,
            max_context_length=8,
            slo_ttft_p99_ms=1,
            slo_tbt_p99_ms=1,
        )
        more = Deployment.objects.create(model=model, host=other)
        more.devices.set([device])
        add_engine_sample(more, timezone.now())
    assert queries() == small


@pytest.mark.parametrize(
    "accept",
    [
        "text/plain",
        "text/plain;version=0.0.4",
        # Telegraf's prometheus input: protobuf or the text format, nothing else
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,"
        "text/plain;version=0.0.4;q=0.3",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    ],
)
def test_a_scraper_asking_for_the_text_format_gets_it(viewer_client: Client, accept: str) -> None:
    response = viewer_client.get("/api/v1/metrics/", headers={"Accept": accept})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    families = text_string_to_metric_families(response.content.decode())
    assert "llmp_jobs" in {family.name for family in families}


def test_an_unauthenticated_scrape_asking_for_text_is_still_a_401(viewer_user: User) -> None:
    response = Client().get("/api/v1/metrics/", headers={"Accept": "text/plain;version=0.0.4"})
    assert response.status_code == 401


@pytest.mark.parametrize("status", [HostStatus.STALE, HostStatus.OFFLINE])
def test_a_device_whose_host_is_down_reports_its_total_only(
    viewer_client: Client, host: Host, status: HostStatus
) -> None:
    # The host's last sample, a second old, was exported as the device's current use.
    host.status = status
    host.save()
    gpu0 = Device.objects.get(host=host, index=0)
    add_device_sample(gpu0, timezone.now() - timedelta(seconds=1), utilization_pct=50.0, lent_bytes=GIB)
    got = scrape(viewer_client)
    gpu = labels(host="sim-a", name="H100", kind="gpu", gpu="0")
    assert got[("llmp_gpu_memory_total_bytes", gpu)] == 80 * GIB
    for field in ("used", "free", "lent", "borrowed"):
        assert (f"llmp_gpu_memory_{field}_bytes", gpu) not in got
    assert ("llmp_gpu_utilization_ratio", gpu) not in got
    assert got[("llmp_gpu_aqua_role", gpu | {("role", "none")})] == 1.0


def test_a_device_whose_newest_sample_is_old_reports_its_total_only(
    viewer_client: Client, host: Host
) -> None:
    # The host is online (its agent beats) but the device's samples stopped two minutes ago.
    host.status = HostStatus.ONLINE
    host.save()
    gpu0, gpu1 = Device.objects.filter(host=host).order_by("index")
    add_device_sample(gpu0, timezone.now() - timedelta(minutes=2), utilization_pct=50.0)
    add_device_sample(gpu1, timezone.now() - timedelta(seconds=1), utilization_pct=30.0)
    got = scrape(viewer_client)
    old, new = (labels(host="sim-a", name="H100", kind="gpu", gpu=str(i)) for i in (0, 1))
    assert got[("llmp_gpu_memory_total_bytes", old)] == 80 * GIB
    assert ("llmp_gpu_memory_used_bytes", old) not in got
    assert ("llmp_gpu_memory_free_bytes", old) not in got
    assert ("llmp_gpu_utilization_ratio", old) not in got
    assert got[("llmp_gpu_memory_used_bytes", new)] == 10 * GIB
    assert got[("llmp_gpu_utilization_ratio", new)] == 0.3


def test_a_device_of_an_agent_that_reports_each_minute_keeps_its_readings_between_reports(
    viewer_client: Client, host: Host
) -> None:
    # An agent started with --telemetry-interval-s 60 is online for 150 s after a report: its
    # devices' readings must not drop out for the second half of every minute.
    host.status, host.heartbeat_interval_s = HostStatus.ONLINE, 60.0
    host.save()
    gpu0 = Device.objects.get(host=host, index=0)
    add_device_sample(gpu0, timezone.now() - timedelta(seconds=90), utilization_pct=50.0)
    got = scrape(viewer_client)
    gpu = labels(host="sim-a", name="H100", kind="gpu", gpu="0")
    assert got[("llmp_gpu_memory_used_bytes", gpu)] == 10 * GIB
    assert got[("llmp_gpu_utilization_ratio", gpu)] == 0.5


def test_an_engine_of_an_agent_that_reports_each_minute_keeps_its_window_between_reports(
    viewer_client: Client, host: Host, deployment: Deployment
) -> None:
    # As for its devices: the engine's newest window, 90 s old, is current while the host, beating
    # each minute, is online (150 s); a fixed minute dropped it for the second half of every minute.
    host.status, host.heartbeat_interval_s = HostStatus.ONLINE, 60.0
    host.save()
    add_engine_sample(deployment, timezone.now() - timedelta(seconds=90), running=4)
    got = scrape(viewer_client)
    dep = {"deployment": str(deployment.pk), "model": "tiny"}
    assert got[("llmp_engine_requests_running", labels(**dep))] == 4
    assert got[("llmp_engine_ttft_seconds", labels(**dep, quantile="0.99"))] == 0.3


@pytest.mark.parametrize("status", [HostStatus.STALE, HostStatus.OFFLINE])
def test_an_engine_whose_host_is_down_is_not_shown_as_current(
    viewer_client: Client, host: Host, deployment: Deployment, status: HostStatus
) -> None:
    # The rule of its host's devices: a window a second old from a host gone stale is not current.
    host.status = status
    host.save()
    add_engine_sample(deployment, timezone.now() - timedelta(seconds=1), running=5)
    got = scrape(viewer_client)
    assert not [key for key in got if key[0].startswith("llmp_engine_")]
    assert ("llmp_model_slo_attainment_ratio", labels(model="tiny")) not in got
