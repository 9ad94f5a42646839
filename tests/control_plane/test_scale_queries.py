"""Query counts at fleet scale: list endpoints, dashboard snapshots and the gateway's hot path issue
the same number of queries for 2 hosts as for 20 (8 GPUs each, with deployments, samples, jobs,
keys and plans): no query per row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from accounts.models import User
from accounts.services import create_api_key
from agents.models import DeviceSample, EngineSample, Replica
from dashboard import snapshots
from deployments.models import Deployment, ObservedState
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from gateway import services as gateway
from inventory.models import Device, Host, HostStatus
from jobs.models import Job
from planning.models import ModelProfile, PlacementPlan
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

GPUS = 8
TP = 2  # each host runs GPUS // TP deployments


@dataclass
class Fleet:
    models: list[ServedModel]
    hosts: list[Host]


def add_hosts(fleet: Fleet, count: int, owner: User) -> None:
    """Add ``count`` hosts of 8 GPUs, each running 4 deployments (TP 2, one per model) with
    replicas and samples, and a job, placement plan and API key per host."""
    now = timezone.now()
    for h in range(len(fleet.hosts), len(fleet.hosts) + count):
        host = Host.objects.create(name=f"h{h}", status=HostStatus.ONLINE, last_seen_at=now)
        fleet.hosts.append(host)
        devices = Device.objects.bulk_create(
            Device(host=host, index=i, uuid=f"h{h}-{i}", name="H100", memory_total_bytes=80 << 30)
            for i in range(GPUS)
        )
        DeviceSample.objects.bulk_create(
            DeviceSample(device=d, ts=now - timedelta(seconds=s), memory_used_bytes=1, memory_free_bytes=2)
            for d in devices
            for s in (1, 2)
        )
        for i, model in enumerate(fleet.models):
            dep = Deployment.objects.create(model=model, host=host, observed_state=ObservedState.RUNNING)
            dep.devices.set(devices[i * TP : (i + 1) * TP])
            Replica.objects.create(
                deployment=dep, state="running", base_url=f"http://h{h}:{8000 + i}", reported_at=now
            )
            EngineSample.objects.bulk_create(
                EngineSample(deployment=dep, ts=now - timedelta(seconds=s), state="running", ttft_count=3)
                for s in (1, 2, 3)
            )
        job = Job.objects.create(kind="place", status="succeeded", created_by=owner)
        PlacementPlan.objects.create(job=job, plan={}, moves=[], fingerprint="x", applied_by=owner)
        create_api_key(owner, f"key-{h}")


@pytest.fixture
def fleet(alice: User) -> Fleet:
    """4 models (TP 2) with profiles; no hosts yet (tests add them with ``add_hosts``)."""
    models = []
    for i in range(GPUS // TP):
        model = ServedModel.objects.create(
            name=f"m{i}",
            source=f"/m{i}",
            tensor_parallel_size=TP,
            max_context_length=1024,
            slo_ttft_p99_ms=500,
            slo_tbt_p99_ms=50,
        )
        ModelProfile.objects.create(
            model=model,
            backend="simulator",
            role="producer",
            max_rps=1.0,
            kv_capacity_bytes=1,
            free_kv_bytes=1,
            lendable_bytes=1,
            slo_ttft_p99_ms=500,
            slo_tbt_p99_ms=50,
            data={},
        )
        models.append(model)
    return Fleet(models, [])


def count_queries(fn: Callable[[], Any]) -> int:
    with CaptureQueriesContext(connection) as captured:
        fn()
    return len(captured.captured_queries)


def counts_small_and_large(fleet: Fleet, owner: User, fn: Callable[[], Any]) -> tuple[int, int]:
    """Queries ``fn`` issues with 2 hosts, then with 20 (after a first call: one-off writes such as
    a token's ``last_used_at`` or the day's first usage row are not counted)."""
    add_hosts(fleet, 2, owner)
    fn()
    small = count_queries(fn)
    add_hosts(fleet, 18, owner)
    large = count_queries(fn)
    return small, large


def _per_minute(fn: Callable[[], Any]) -> Any:
    """``fn`` with a raw window shorter than the model page's history: it reads minute rows."""
    with override_settings(TELEMETRY_RAW_RETENTION_S=60.0):
        return fn()


LISTS = [
    "/api/v1/hosts/",
    "/api/v1/devices/",
    "/api/v1/deployments/",
    "/api/v1/models/",
    "/api/v1/jobs/",
    "/api/v1/api-keys/",
    "/api/v1/plans/",
    "/api/v1/profiles/",
]


@pytest.mark.parametrize("url", LISTS)
def test_it_lists_without_a_query_per_row(
    admin_client: APIClient, alice: User, fleet: Fleet, url: str
) -> None:
    def get() -> None:
        response = admin_client.get(url, {"page_size": 500})
        assert response.status_code == 200, response.data

    small, large = counts_small_and_large(fleet, alice, get)
    assert large == small, f"{url}: {small} queries for 2 hosts, {large} for 20"
    assert large <= 8


@pytest.mark.parametrize(
    "build",
    [
        snapshots.overview,
        snapshots.jobs,
        lambda: snapshots.model_history(ServedModel.objects.get(name="m0")),
        lambda: _per_minute(lambda: snapshots.model_history(ServedModel.objects.get(name="m0"))),
    ],
    ids=["overview", "jobs", "model_history", "model_history_per_minute"],
)
def test_it_builds_dashboard_snapshots_without_a_query_per_row(
    alice: User, fleet: Fleet, build: Callable[[], Any]
) -> None:
    small, large = counts_small_and_large(fleet, alice, build)
    assert large == small, f"{small} queries for 2 hosts, {large} for 20"
    assert large <= 6


def test_it_admits_and_finishes_a_gateway_request_in_a_fixed_number_of_queries(
    alice: User, fleet: Fleet, django_assert_max_num_queries: Any
) -> None:
    issued = create_api_key(alice, "hot")
    authorization = f"Bearer {issued.plaintext}"

    def request() -> None:
        key = gateway.authenticate(authorization)
        admission = gateway.admit(key, "m0")
        outcome = gateway.Outcome(
            admission.targets[0].deployment_id, True, "completed", 5, 7, 0.1, 0.01, 0.02
        )
        gateway.finish(admission, outcome)

    small, large = counts_small_and_large(fleet, alice, request)
    assert large == small
    # Steady state (usage and rate-limit rows exist); one of them reads the database clock, the
    # rate limit's time (gateway.quota.database_now). The token reservation costs the key's row
    # lock, its insert and its delete, in a transaction (a savepoint pair inside the test's).
    with django_assert_max_num_queries(14):
        request()


def test_the_model_socket_reads_new_points_without_a_query_per_deployment(alice: User, fleet: Fleet) -> None:
    from dashboard.consumers import ModelConsumer

    model = fleet.models[0]
    socket = ModelConsumer()
    socket.model, socket._after = model, {}

    def read() -> dict[int, list[dict[str, Any]]]:
        new = socket._read_new()
        assert new is not None
        return new

    small, large = counts_small_and_large(fleet, alice, read)
    assert large == small, f"{small} queries for 2 hosts, {large} for 20"
    assert large <= 2
    # It still reads every deployment's samples, each once: a new sample is the only new point.
    deployment = Deployment.objects.filter(model=model).order_by("pk").last()
    assert deployment is not None
    EngineSample.objects.create(deployment=deployment, ts=timezone.now(), state="running", ttft_count=4)
    new = read()
    assert {pk: len(points) for pk, points in new.items() if points} == {deployment.pk: 1}
    assert new[deployment.pk][0]["rate"] is not None  # the window since its previous sample
