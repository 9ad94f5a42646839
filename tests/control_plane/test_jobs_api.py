"""Jobs over the API and the job service, with the task function called in-process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError
from jobs import registry, services
from jobs.models import Job, JobStatus
from jobs.registry import JobKind, register
from jobs.tasks import run_job
from rest_framework.test import APIClient

URL = "/api/v1/jobs/"
pytestmark = pytest.mark.django_db


def test_it_enqueues_a_job_after_commit(
    admin_client: APIClient, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(run_job, "apply_async", lambda args, task_id: sent.append((args, task_id)))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = admin_client.post(URL, {"kind": "noop", "params": {"steps": 3}}, format="json")
    assert response.status_code == 201, response.data
    job = Job.objects.get(pk=response.data["id"])
    assert (job.status, job.params) == (JobStatus.QUEUED, {"steps": 3, "delay_s": 0.1})
    assert job.created_by is not None and job.created_by.username == "alice"
    assert len(callbacks) == 1
    assert sent == [((job.pk,), job.celery_id)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "nope"}, "kind"),
        ({"kind": "noop", "params": {"steps": 0}}, "params"),
        ({"kind": "noop", "params": {"stepz": 3}}, "params"),
        ({"kind": "noop", "params": [1]}, "params"),
        ({"kind": "noop", "status": "succeeded"}, "status"),
        ({"kind": "noop", "priority": 1}, "priority"),
    ],
)
def test_it_rejects_bad_jobs(admin_client: APIClient, body: dict[str, Any], field: str) -> None:
    response = admin_client.post(URL, body, format="json")
    assert response.status_code == 400
    assert field in response.data
    assert Job.objects.count() == 0


def test_it_runs_a_job_through_the_task_function() -> None:
    job = services.create_job("noop", {"steps": 4, "delay_s": 0.0}, None)
    run_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.progress == 1.0
    assert job.result == {"steps_done": 4}
    assert job.started_at is not None and job.finished_at is not None
    assert job.started_at <= job.finished_at


def test_it_records_a_failing_job_with_its_error() -> None:
    job = services.create_job("noop", {"steps": 5, "delay_s": 0.0, "fail_at_step": 3}, None)
    run_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "noop failed at step 3" in job.error
    assert job.progress == pytest.approx(0.4)
    assert job.result is None


def test_a_noop_asked_to_fail_past_its_last_step_is_refused(admin_client: APIClient) -> None:
    """fail_at_step 5 of 3 steps was stored, and the job "asked to fail" succeeded."""
    for params in ({"steps": 3, "fail_at_step": 5}, {"fail_at_step": 6}):  # the default: 5 steps
        response = admin_client.post(URL, {"kind": "noop", "params": params}, format="json")
        assert response.status_code == 400 and "fail_at_step" in response.data["params"], response.data
    assert not Job.objects.exists()
    ok = admin_client.post(URL, {"kind": "noop", "params": {"steps": 3, "fail_at_step": 3}}, format="json")
    assert ok.status_code == 201


def test_it_does_not_run_a_job_cancelled_while_queued(admin_client: APIClient) -> None:
    job = services.create_job("noop", {"steps": 2, "delay_s": 0.0}, None)
    response = admin_client.post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 200
    assert response.data["status"] == "cancelled"
    run_job(job.pk)
    job.refresh_from_db()
    assert (job.status, job.progress, job.started_at) == (JobStatus.CANCELLED, 0.0, None)


def test_it_refuses_to_cancel_a_finished_job(admin_client: APIClient, viewer_client: APIClient) -> None:
    job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert viewer_client.post(f"{URL}{job.pk}/cancel/").status_code == 403
    run_job(job.pk)
    response = admin_client.post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 409
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED


def test_it_stops_a_running_job_at_its_next_step_when_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner that cancels its own job mid-way stands in for a cancel arriving from the API (a
    kind registered for this test only: later tests see the product's kinds alone)."""
    name = "test-self-cancel"
    steps_run: list[int] = []

    def run(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        for step in range(10):
            steps_run.append(step)
            if step == 3:
                services.cancel_job(Job.objects.get(pk=params["job"]))
            ctx.progress((step + 1) / 10)
        return {"done": True}

    job = job_of_a_test_kind(monkeypatch, name, run)
    run_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert steps_run == [0, 1, 2, 3]
    assert job.result is None


def test_it_retries_transient_database_errors_and_reclaims_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    real_get_kind = services.get_kind
    calls = {"n": 0}

    def flaky(name: str) -> JobKind:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("database is locked")
        return real_get_kind(name)

    monkeypatch.setattr(services, "get_kind", flaky)
    with pytest.raises(OperationalError):
        services.execute_job(job.pk, claim="first")
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING  # left for the retry, not marked failed
    assert services.execute_job(job.pk) is None  # a fresh delivery does not run it twice
    assert services.execute_job(job.pk, claim="other") is None  # nor another delivery's retry
    assert services.execute_job(job.pk, claim="first") == JobStatus.SUCCEEDED
    assert run_job.max_retries == 5


def test_it_refuses_duplicate_job_kinds() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(JobKind(name="noop", params_serializer=services_params(), run=lambda p, c: {}))


def test_it_filters_jobs_by_status(viewer_client: APIClient) -> None:
    done = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    run_job(done.pk)
    queued = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    ids = [row["id"] for row in viewer_client.get(URL, {"status": "queued"}).data["results"]]
    assert ids == [queued.pk]
    ids = [row["id"] for row in viewer_client.get(URL).data["results"]]
    assert ids == [queued.pk, done.pk]  # newest first


def job_of_a_test_kind(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    run: Callable[[dict[str, Any], Any], dict[str, Any]],
    **fields: Any,
) -> Job:
    """A job of kind `name` (registered for this test only, running `run`), its params {"job": its pk}."""
    monkeypatch.setitem(
        registry._KINDS, name, JobKind(name=name, params_serializer=services_params(), run=run)
    )
    job = Job.objects.create(kind=name, params={}, **fields)
    job.params = {"job": job.pk}
    job.save()
    return job


def services_params() -> Any:
    from jobs.kinds.params import StrictParams

    class AnyParams(StrictParams):
        pass

    return AnyParams


def test_it_lists_job_kinds_with_their_parameters(viewer_client: APIClient) -> None:
    response = viewer_client.get(f"{URL}kinds/")
    assert response.status_code == 200
    noop = next(kind for kind in response.data if kind["name"] == "noop")
    assert noop["params"]["steps"] == {
        "type": "integer",
        "required": False,
        "default": 5,
        "min_value": 1,
        "max_value": 100_000,
    }
    assert noop["params"]["fail_at_step"]["required"] is False
    # A client building the form needs a choice's choices, an object's fields and a list's items:
    # they were described as "choice", "workloadparams" and "list" alone.
    kinds = {kind["name"]: kind["params"] for kind in response.data}
    assert kinds["place"]["solver"]["choices"] == ["cp-sat", "greedy"]
    assert kinds["place"]["models"]["items"] == {"type": "slug", "max_length": 100}
    workload = kinds["profile"]["workload"]
    assert workload["type"] == "object" and workload["required"] is False
    assert workload["params"]["kind"] == {
        "type": "choice",
        "required": False,
        "default": "poisson",
        "choices": ["poisson", "gamma"],
    }
    assert kinds["profile"]["burst_levels"]["items"] == {"type": "float", "min_value": 1.0, "max_value": 64.0}
    # A list's bounds count its items, a string's its characters: both were "max_length", so the
    # place job's list of at most 1,000 names read alike with each name's limit of 100 characters.
    models = kinds["place"]["models"]
    assert (models["min_items"], models["max_items"]) == (1, 1000)
    assert "max_length" not in models and "min_length" not in models
    assert (kinds["profile"]["burst_levels"]["min_items"], kinds["profile"]["burst_levels"]["max_items"]) == (
        1,
        10,
    )
