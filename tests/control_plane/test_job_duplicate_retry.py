"""A job runs once, however its messages arrive: a second message for a job (a worker's start
re-sends every queued job's) whose claim hits a transient database error is retried, and that retry
must not take over the job the first message's worker is running, as a retry of the job's own
run does. The task runs in-process through Celery's apply(), retries included."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError
from django.db.models import QuerySet
from django.utils import timezone
from jobs import registry, services
from jobs.liveness import fail_lost_jobs
from jobs.models import Job, JobStatus
from jobs.registry import JobContext, JobKind
from jobs.tasks import run_job

from tests.control_plane.test_jobs_api import job_of_a_test_kind, services_params

pytestmark = pytest.mark.django_db


def failing_claims(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make the next `failures["left"]` claims fail with a transient database error (worker_name
    is evaluated by the claim's UPDATE); the returned dict is that counter."""
    real_worker_name = services.worker_name
    failures = {"left": 0}

    def worker_name() -> str:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return real_worker_name()

    monkeypatch.setattr(services, "worker_name", worker_name)
    return failures


def test_a_duplicate_message_retried_after_a_database_error_does_not_run_the_job_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[int] = []
    failures = failing_claims(monkeypatch)

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        if len(runs) == 1:
            # While the first delivery runs the job, the duplicate arrives; its claim fails once.
            failures["left"] = 1
            run_job.apply(args=(params["job"],), task_id=Job.objects.get(pk=params["job"]).celery_id)
        ctx.progress(1.0)
        return {"runs": len(runs)}

    job = job_of_a_test_kind(monkeypatch, "once", run, celery_id="c-1")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert runs == [0]
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"runs": 1})


def test_a_retry_after_a_database_error_in_the_run_takes_the_job_up_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[int] = []

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        if len(runs) == 1:
            raise OperationalError("database is locked")
        ctx.progress(1.0)
        return {"runs": len(runs)}

    monkeypatch.setitem(
        registry._KINDS, "flaky", JobKind(name="flaky", params_serializer=services_params(), run=run)
    )
    job = Job.objects.create(kind="flaky", params={}, celery_id="c-2")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert runs == [0, 1]
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"runs": 2})


def _always_failing(runs: list[int]) -> Any:
    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        raise OperationalError("server closed the connection unexpectedly")

    return run


def test_a_job_whose_retries_are_used_up_fails_at_once_naming_the_database_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It stayed running until the lost-job sweep failed it with "Worker lost: no heartbeat ...".
    runs: list[int] = []
    job = job_of_a_test_kind(monkeypatch, "down", _always_failing(runs), celery_id="c-3")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert runs == [0, 1, 2, 3, 4, 5]  # the run and its 5 retries
    assert job.status == JobStatus.FAILED and job.finished_at is not None
    assert job.error == (
        "Failed after 5 retries on a database error: "
        "OperationalError: server closed the connection unexpectedly"
    )


def test_a_job_whose_retries_are_used_up_while_the_database_refuses_every_write_is_failed_by_the_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[int] = []
    down = {"now": False}
    real_update = QuerySet.update

    def update(self: QuerySet[Any], **kwargs: Any) -> int:
        if down["now"]:
            raise OperationalError("the database system is shutting down")
        return real_update(self, **kwargs)

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        down["now"] = len(runs) == 6  # the last retry: the job's failure cannot be written either
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(QuerySet, "update", update)
    job = job_of_a_test_kind(monkeypatch, "down", run, celery_id="c-4")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    down["now"] = False
    job.refresh_from_db()
    assert (runs, job.status) == ([0, 1, 2, 3, 4, 5], JobStatus.RUNNING)
    later = timezone.now() + timedelta(seconds=settings.JOBS_LOST_AFTER_S + 1)
    assert fail_lost_jobs(now=later) == [job.pk]
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.error.startswith("Worker lost"), job.error


def test_a_duplicate_message_whose_retries_are_used_up_leaves_the_job_another_delivery_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its last retry's failure is its own: the job runs under the first delivery's claim.
    runs: list[int] = []
    failures = failing_claims(monkeypatch)

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        failures["left"] = 6  # the duplicate's claim fails on its try and on its 5 retries
        run_job.apply(args=(params["job"],), task_id=Job.objects.get(pk=params["job"]).celery_id)
        assert failures["left"] == 0
        ctx.progress(1.0)
        return {"runs": len(runs)}

    job = job_of_a_test_kind(monkeypatch, "once", run, celery_id="c-5")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert runs == [0]
    assert (job.status, job.result, job.error) == (JobStatus.SUCCEEDED, {"runs": 1}, "")


def test_a_queued_job_whose_claim_fails_through_every_retry_is_failed_at_once_naming_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its delivery's claim (queued -> running) hit the error on the try and on its 5 retries: the
    # job stayed queued, with no message left, until a worker start re-sent it.
    runs: list[int] = []
    failures = failing_claims(monkeypatch)
    failures["left"] = 6
    job = job_of_a_test_kind(monkeypatch, "never", _always_failing(runs), celery_id="c-6")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert (runs, failures["left"], job.started_at) == ([], 0, None)
    assert job.status == JobStatus.FAILED and job.finished_at is not None
    assert job.error == (
        "Failed after 5 retries on a database error: "
        "OperationalError: server closed the connection unexpectedly"
    )


def test_a_queued_job_whose_last_claim_retry_succeeds_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    failures = failing_claims(monkeypatch)
    failures["left"] = 5  # the try and 4 retries: the fifth retry claims it

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        return {"runs": len(runs)}

    job = job_of_a_test_kind(monkeypatch, "late", run, celery_id="c-7")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert (runs, job.status, job.result, job.error) == ([0], JobStatus.SUCCEEDED, {"runs": 1}, "")
