"""A retried job starts its new run at 0 % progress.

A Celery retry (a transient database error in the run) takes the job up again and runs it from the
start, but the claim kept the earlier run's progress: the job's row, the API and the dashboard's
progress bar showed the old run's 60 % while the new run started over, then fell back to the new
run's first report. The claim of a new run now resets the progress (as it resets the error and the
start time). The task runs in-process through Celery's apply(), retries included."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError
from jobs.models import Job, JobStatus
from jobs.registry import JobContext
from jobs.tasks import run_job

from tests.control_plane.test_jobs_api import job_of_a_test_kind

pytestmark = pytest.mark.django_db


def test_it_resets_the_progress_when_a_retry_takes_the_job_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    seen_at_start: list[float] = []  # the row's progress as each run starts

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        seen_at_start.append(Job.objects.get(pk=params["job"]).progress)
        if len(seen_at_start) == 1:
            ctx.progress(0.6)
            raise OperationalError("server closed the connection unexpectedly")
        return {"runs": len(seen_at_start)}

    job = job_of_a_test_kind(monkeypatch, "flaky", run, celery_id="c-1")

    run_job.apply(args=(job.pk,), task_id=job.celery_id)

    job.refresh_from_db()
    assert seen_at_start == [0.0, 0.0]
    assert (job.status, job.progress, job.result) == (JobStatus.SUCCEEDED, 1.0, {"runs": 2})
