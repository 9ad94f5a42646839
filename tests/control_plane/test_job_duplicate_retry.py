"""A job runs once, however its messages arrive: a second message for a job (a worker's start
re-sends every queued job's) whose claim hits a transient database error is retried, and that retry
must not take over the job the first message's worker is running, as a retry of the job's own
run does. The task runs in-process through Celery's apply(), retries included."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError
from jobs import registry, services
from jobs.models import Job, JobStatus
from jobs.registry import JobContext, JobKind
from jobs.tasks import run_job

from tests.control_plane.test_jobs_api import job_of_a_test_kind, services_params

pytestmark = pytest.mark.django_db


def test_a_duplicate_message_retried_after_a_database_error_does_not_run_the_job_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[int] = []
    real_worker_name = services.worker_name
    failures = {"left": 0}

    def worker_name() -> str:  # evaluated by the claim's UPDATE: a transient error there
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return real_worker_name()

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        runs.append(len(runs))
        if len(runs) == 1:
            # While the first delivery runs the job, the duplicate arrives; its claim fails once.
            failures["left"] = 1
            run_job.apply(args=(params["job"],), task_id=Job.objects.get(pk=params["job"]).celery_id)
        ctx.progress(1.0)
        return {"runs": len(runs)}

    monkeypatch.setattr(services, "worker_name", worker_name)
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
