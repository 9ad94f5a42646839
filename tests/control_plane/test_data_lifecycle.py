"""Data lifecycle at fleet scale: what grows per second or per request is pruned on the retention
schedule through indexes, and deleting a host, deployment, model or user leaves no orphans and
keeps the usage history billing needs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from accounts.models import ApiKey, ApiToken, User
from accounts.services import create_api_key, issue_api_token
from agents import history
from agents.models import AgentLink, DeviceMinute, DeviceSample, EngineMinute, EngineSample, Replica
from agents.retention import downsample_and_prune, minute_of
from agents.tasks import downsample_telemetry
from dashboard import snapshots
from deployments.models import Deployment, DesiredState
from django.db import connection
from django.db.models import ProtectedError
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from gateway.models import RateLimitState, RequestSample, Usage
from gateway.quota import take_request, tokens_held_today
from gateway.services import REQUEST_SAMPLE_RETENTION, latency_summary, record_usage
from inventory.models import AgentToken, Device, Host
from inventory.services import issue_agent_token
from jobs.models import Job
from planning.models import ModelProfile, ProbeRequest
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
MODELS_URL = "/api/v1/models/"


@pytest.fixture
def model(model_payload: dict[str, Any]) -> ServedModel:
    return ServedModel.objects.create(**{**model_payload, "tensor_parallel_size": 1})


@pytest.fixture
def host() -> Host:
    """A host with two GPUs, each with a raw sample and a minute row, an agent token and link."""
    host = Host.objects.create(name="gpu-a")
    issue_agent_token(host)
    AgentLink.objects.create(host=host, connected=True)
    now = timezone.now()
    for i in range(2):
        device = Device.objects.create(host=host, index=i, uuid=f"g{i}", name="H100", memory_total_bytes=1)
        DeviceSample.objects.create(device=device, ts=now, memory_used_bytes=0, memory_free_bytes=1)
        DeviceMinute.objects.create(
            device=device,
            minute=now.replace(second=0, microsecond=0),
            samples=1,
            memory_used_bytes=0,
            memory_used_max_bytes=0,
            memory_free_bytes=1,
        )
    return host


def deploy(model: ServedModel, host: Host) -> Deployment:
    """A deployment on the host's first GPU with a replica, engine samples and a request sample."""
    now = timezone.now()
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set([host.devices.get(index=0)])
    Replica.objects.create(deployment=deployment, state="running", reported_at=now)
    EngineSample.objects.create(deployment=deployment, ts=now, state="running")
    EngineMinute.objects.create(
        deployment=deployment, minute=now.replace(second=0, microsecond=0), samples=1, state="running"
    )
    request_sample(model, deployment, now)
    return deployment


def request_sample(model: ServedModel, deployment: Deployment | None, ts: Any) -> RequestSample:
    return RequestSample.objects.create(
        model=model, deployment=deployment, ts=ts, stream=True, outcome="completed", ttft_s=0.1
    )


# -- retention ------------------------------------------------------------------------------------


def test_it_prunes_request_samples_past_their_retention_on_the_telemetry_schedule(model: ServedModel) -> None:
    now = timezone.now()
    old = request_sample(model, None, now - REQUEST_SAMPLE_RETENTION - timedelta(minutes=1))
    kept = request_sample(model, None, now - REQUEST_SAMPLE_RETENTION + timedelta(minutes=1))

    downsample_telemetry()  # the beat task; the ASGI sweeper runs the same function

    assert list(RequestSample.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not RequestSample.objects.filter(pk=old.pk).exists()


def test_request_samples_outlive_the_longest_latency_window_the_api_serves(
    admin_client: APIClient, model: ServedModel
) -> None:
    week = 7 * 86400
    assert timedelta(seconds=week) <= REQUEST_SAMPLE_RETENTION
    response = admin_client.get(f"/api/v1/gateway/latency/{model.name}/", {"window_s": week + 1})
    assert response.status_code == 400  # nothing asks for older samples than are kept


# Tables that grow per second or per request: no query may read one of them whole.
GROWING = (
    "agents_devicesample",
    "agents_enginesample",
    "agents_deviceminute",
    "agents_engineminute",
    "gateway_requestsample",
    "gateway_usage",
)


def full_scans(run: Callable[[], Any]) -> list[str]:
    """The queries ``run`` issues that scan a growing table (SQLite's EXPLAIN QUERY PLAN)."""
    with CaptureQueriesContext(connection) as captured:
        run()
    scans = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith(("SELECT", "DELETE", "UPDATE")):
                continue
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = [str(row[-1]) for row in cursor.fetchall()]
            scans += [f"{line} in {sql}" for line in plan if re.match(rf"SCAN ({'|'.join(GROWING)})\b", line)]
    return scans


@dataclass
class Telemetry:
    deployment: Deployment
    kept_minute_ts: datetime  # a sample retention folds into a minute row it keeps


@pytest.fixture
def telemetry(host: Host, model: ServedModel) -> Telemetry:
    """A deployment with samples old enough for retention to fold, and minutes old enough to drop."""
    deployment = deploy(model, host)
    now = timezone.now()
    week_ago = now - timedelta(days=8)
    hour_ago = now - timedelta(hours=1)
    for ts in (week_ago, week_ago + timedelta(minutes=20), hour_ago):
        old_samples(deployment, ts)
    request_sample(model, deployment, week_ago)
    return Telemetry(deployment, hour_ago)


def old_samples(deployment: Deployment, ts: datetime) -> None:
    device = deployment.devices.get()
    DeviceSample.objects.create(device=device, ts=ts, memory_used_bytes=0, memory_free_bytes=1)
    EngineSample.objects.create(deployment=deployment, ts=ts, state="running")


@pytest.fixture
def sqlite() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("reads SQLite's query plans")


@pytest.mark.usefixtures("sqlite")
def test_retention_reads_no_growing_table_whole(telemetry: Telemetry) -> None:
    reports = []
    assert full_scans(lambda: reports.append(downsample_and_prune())) == []
    assert reports[0].raw_deleted and reports[0].minutes_deleted and reports[0].request_samples_deleted

    # Late samples of a minute already folded: merged into its stored rows.
    old_samples(telemetry.deployment, telemetry.kept_minute_ts)
    reports.clear()
    assert full_scans(lambda: reports.append(downsample_and_prune())) == []
    assert (reports[0].device_minutes, reports[0].engine_minutes) == (1, 1)
    device = telemetry.deployment.devices.get()
    assert DeviceMinute.objects.get(device=device, minute=minute_of(telemetry.kept_minute_ts)).samples == 2


@pytest.mark.usefixtures("sqlite")
def test_dashboard_and_gateway_read_no_growing_table_whole(
    telemetry: Telemetry, model: ServedModel, bob: User
) -> None:
    downsample_and_prune()  # minute rows to read
    since = timezone.now() - timedelta(hours=2)
    devices = list(Device.objects.values_list("pk", flat=True))
    key = create_api_key(bob, "k").record

    def read() -> None:
        snapshots.overview()
        snapshots.model_history(model)
        snapshots.engine_points({telemetry.deployment.pk: since}, {})
        for resolution in ("raw", "minute"):
            history.device_series(devices, since, resolution)
            history.engine_series(telemetry.deployment.pk, since, resolution)
        latency_summary(model)
        record_usage(key.pk, model.pk, 1, 2)
        tokens_held_today(key.pk, timezone.now())

    assert full_scans(read) == []


# -- deleting hosts and deployments --------------------------------------------------------------


def _rows_of(host_devices: list[int]) -> dict[str, int]:
    return {
        "devices": Device.objects.filter(pk__in=host_devices).count(),
        "device samples": DeviceSample.objects.filter(device_id__in=host_devices).count(),
        "device minutes": DeviceMinute.objects.filter(device_id__in=host_devices).count(),
    }


def test_a_host_with_deployments_cannot_be_deleted(host: Host, model: ServedModel) -> None:
    deployment = deploy(model, host)
    devices = list(host.devices.values_list("pk", flat=True))
    before = _rows_of(devices)

    with pytest.raises(ProtectedError):
        host.delete()

    assert Host.objects.filter(pk=host.pk).exists()
    assert _rows_of(devices) == before
    assert list(deployment.devices.values_list("pk", flat=True)) == devices[:1]


def test_deleting_a_host_removes_its_devices_telemetry_tokens_link_and_probes(
    host: Host, model: ServedModel
) -> None:
    deploy(model, host).delete()  # what the operator must do first
    ProbeRequest.objects.create(probe_id="p1", host=host, frame={})
    devices = list(host.devices.values_list("pk", flat=True))

    host.delete()

    assert _rows_of(devices) == {"devices": 0, "device samples": 0, "device minutes": 0}
    assert not AgentToken.objects.exists()
    assert not AgentLink.objects.exists()
    assert not ProbeRequest.objects.exists()


def test_deleting_a_deployment_frees_its_devices_and_keeps_its_request_samples(
    admin_client: APIClient, viewer_client: APIClient, host: Host, model: ServedModel
) -> None:
    deployment = deploy(model, host)
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)  # stopped first
    url = f"/api/v1/deployments/{deployment.pk}/"
    assert viewer_client.delete(url).status_code == 403

    assert admin_client.delete(url).status_code == 204

    assert not Deployment.objects.exists()
    assert not Replica.objects.exists()
    assert not EngineSample.objects.exists()
    assert not EngineMinute.objects.exists()
    assert host.devices.count() == 2
    assert not Deployment.devices.through.objects.exists()
    sample = RequestSample.objects.get()  # the model's latency history is not the deployment's
    assert sample.deployment_id is None


# -- deleting models ------------------------------------------------------------------------------


def test_deleting_a_model_keeps_its_usage_under_its_name(
    admin_client: APIClient, viewer_client: APIClient, bob: User, model: ServedModel
) -> None:
    key = create_api_key(bob, "laptop").record
    record_usage(key.pk, model.pk, 10, 20)
    url = f"{MODELS_URL}{model.pk}/"
    assert viewer_client.delete(url).status_code == 403

    assert admin_client.delete(url).status_code == 204

    assert not ServedModel.objects.filter(pk=model.pk).exists()
    usage = Usage.objects.get()
    assert (usage.key_id, usage.model_id, usage.model_name) == (key.pk, None, model.name)
    assert (usage.requests, usage.total_tokens) == (1, 30)
    rows = viewer_client.get("/api/v1/gateway/usage/").json()["results"]
    assert [(r["model"], r["requests"], r["prompt_tokens"]) for r in rows] == [(model.name, 1, 10)]


def test_a_model_nothing_uses_is_deleted_with_its_profile_and_latency_samples(
    admin_client: APIClient, model: ServedModel
) -> None:
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
    request_sample(model, None, timezone.now())

    assert admin_client.delete(f"{MODELS_URL}{model.pk}/").status_code == 204

    assert not ServedModel.objects.exists()
    assert not ModelProfile.objects.exists()
    assert not RequestSample.objects.exists()


# -- keys and users -------------------------------------------------------------------------------


def test_revoking_a_key_keeps_its_usage(viewer_client: APIClient, bob: User, model: ServedModel) -> None:
    key = create_api_key(bob, "laptop").record
    record_usage(key.pk, model.pk, 10, 20)

    assert viewer_client.post(f"/api/v1/api-keys/{key.pk}/revoke/").status_code == 200

    key.refresh_from_db()
    assert key.revoked
    assert Usage.objects.get().key_id == key.pk


def test_a_user_whose_keys_have_usage_cannot_be_deleted(bob: User, model: ServedModel) -> None:
    key = create_api_key(bob, "laptop").record
    record_usage(key.pk, model.pk, 10, 20)

    with pytest.raises(ProtectedError):
        bob.delete()
    with pytest.raises(ProtectedError):
        key.delete()

    assert User.objects.filter(pk=bob.pk).exists()
    assert Usage.objects.get().key_id == key.pk


def test_the_admin_refuses_to_delete_a_user_whose_keys_have_usage(bob: User, model: ServedModel) -> None:
    record_usage(create_api_key(bob, "laptop").record.pk, model.pk, 10, 20)
    root = User.objects.create_superuser("root", password="root-pw-9f2k", role="admin")
    client = Client()
    client.force_login(root)

    response = client.post(f"/admin/accounts/user/{bob.pk}/delete/", {"post": "yes"})

    assert response.status_code == 200
    assert "protected" in response.content.decode()
    assert User.objects.filter(pk=bob.pk).exists()
    assert Usage.objects.count() == 1


def test_deleting_a_user_without_usage_removes_their_tokens_keys_and_rate_limit_states(bob: User) -> None:
    issue_api_token(bob, "cli")
    key = create_api_key(bob, "laptop").record
    for _ in range(3):
        take_request(key, timezone.now())
    assert RateLimitState.objects.filter(key=key).count() == 1  # one row per key, however busy
    job = Job.objects.create(kind="noop", created_by=bob)

    bob.delete()

    assert not ApiToken.objects.exists()
    assert not ApiKey.objects.exists()
    assert not RateLimitState.objects.exists()
    job.refresh_from_db()
    assert job.created_by is None  # the job's record stays


@pytest.mark.django_db(transaction=True)
def test_the_migration_names_existing_usage_rows_after_their_model() -> None:
    # Rows written before model_name existed get their model's name, so deleting the model later
    # still leaves them attributable.
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("gateway", "0002_requestsample_ts_index")]
    after = [("gateway", "0003_usage_outlives_keys_and_models")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    user = old.get_model("accounts", "User").objects.create(username="carol")
    key = old.get_model("accounts", "ApiKey").objects.create(
        owner=user, name="k", prefix="sk-x", digest="d" * 64, requests_per_minute=1, tokens_per_day=1
    )
    model = old.get_model("registry", "ServedModel").objects.create(
        name="old-llm",
        source="x",
        tensor_parallel_size=1,
        max_context_length=512,
        slo_ttft_p99_ms=1,
        slo_tbt_p99_ms=1,
    )
    old.get_model("gateway", "Usage").objects.create(
        key=key, model=model, period_start=timezone.now(), requests=3
    )

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())  # back to the latest state for other tests

    usage = Usage.objects.get()
    assert (usage.model_name, usage.requests) == ("old-llm", 3)


@pytest.mark.django_db(transaction=True)
def test_the_migration_replaces_the_rate_counters_with_one_state_row_per_key() -> None:
    from django.db.migrations.executor import MigrationExecutor

    counters = [("gateway", "0003_usage_outlives_keys_and_models")]
    state = [("gateway", "0004_ratelimitstate_replaces_ratewindow")]
    executor = MigrationExecutor(connection)
    executor.migrate(counters)
    old = executor.loader.project_state(counters).apps
    user = old.get_model("accounts", "User").objects.create(username="carol")
    key = old.get_model("accounts", "ApiKey").objects.create(
        owner=user, name="k", prefix="sk-x", digest="d" * 64, requests_per_minute=1, tokens_per_day=1
    )
    old.get_model("gateway", "RateWindow").objects.create(key=key, window_start=timezone.now(), count=1)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(state)

    assert "gateway_ratewindow" not in connection.introspection.table_names()
    take_request(ApiKey.objects.get(pk=key.pk), timezone.now())  # the key starts with its full burst
    assert RateLimitState.objects.get().key_id == key.pk
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())  # back to the latest state for other tests
