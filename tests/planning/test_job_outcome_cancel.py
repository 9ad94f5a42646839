"""A cancel landing just after a job's outcome (a profile, a plan) was written.

The profile job made its profile the model's current one in one transaction and marked itself
succeeded in another: a cancel in between left a cancelled job whose profile the placer used (and
the place job a cancelled job with a stored plan). The outcome is now written in the transaction
that marks the job succeeded, after locking the job's row and finding it still running: a cancel
from another connection at that moment waits for it (PostgreSQL's row lock; SQLite serialises
writers, and the cancel here does not wait: it fails at once with "database is locked") and then
finds the job succeeded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from jobs.kinds.place import PlaceParams
from jobs.models import Job, JobStatus
from jobs.services import JobNotActive, cancel_job, execute_job
from planning import placing, profiling
from planning.models import ModelProfile, PlacementPlan

from tests.pg_locks import backend_pid, in_thread
from tests.planning.helpers import GIB, make_host, make_model, queued_profile_job, result_of, store_profile

pytestmark = pytest.mark.django_db(transaction=True)


def _blocked(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_locks WHERE NOT granted AND pid = %s", [pid])
        return cursor.fetchone() is not None


class CancelMeanwhile:
    """Wraps an outcome write (`store_profile`, `store_plan`): once it has written, job `job_id`
    is cancelled from a thread (its own connection), and the write returns once that cancel ended
    or waits for a lock. `errors` gets what the cancel raised, once `join` returns."""

    def __init__(self, write: Callable[..., Any], job_id: int) -> None:
        self.write = write
        self.job_id = job_id
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.write(*args, **kwargs)
        pid: list[int] = []
        ready = threading.Event()

        def cancel() -> None:
            if connection.vendor == "sqlite":
                with connection.cursor() as cursor:  # fail at once where it would wait for a writer
                    cursor.execute("PRAGMA busy_timeout = 0")
            else:
                pid.append(backend_pid())
            ready.set()
            cancel_job(Job.objects.get(pk=self.job_id))

        thread = in_thread("cancel", cancel, self.errors)
        self.threads.append(thread)
        assert ready.wait(30)
        deadline = time.monotonic() + 30
        while thread.is_alive() and not (pid and _blocked(pid[0])):
            assert time.monotonic() < deadline, "the cancel neither ended nor waited for a lock"
            time.sleep(0.02)
        return out

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)
            assert not thread.is_alive()


def run_racing(job: Job, cancel: CancelMeanwhile) -> JobStatus | None:
    status = execute_job(job.pk)
    cancel.join()
    job.refresh_from_db()
    return status


def assert_the_cancel_came_too_late(cancel: CancelMeanwhile, job: Job) -> None:
    assert len(cancel.threads) == 1
    if connection.vendor == "sqlite":  # it could not write while the job finished
        assert cancel.errors == ["cancel: OperationalError: database is locked"]
        with pytest.raises(JobNotActive):  # what it meets once it can
            cancel_job(Job.objects.get(pk=job.pk))
    else:  # it waited for the job's row, then found it finished
        assert cancel.errors == [f"cancel: JobNotActive: job {job.pk} is already succeeded"]


def test_a_cancel_just_after_the_profile_is_saved_finds_the_job_succeeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = make_model("llama-3-8b")
    job = queued_profile_job()
    cancel = CancelMeanwhile(profiling.store_profile, job.pk)
    monkeypatch.setattr(profiling, "store_profile", cancel)

    assert run_racing(job, cancel) == JobStatus.SUCCEEDED == job.status, job.error

    assert_the_cancel_came_too_late(cancel, job)
    stored = ModelProfile.objects.get(model=model)
    assert stored.job_id == job.pk and result_of(job)["max_rps"] == stored.max_rps


def test_a_cancel_just_after_the_plan_is_saved_finds_the_job_succeeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_host("host-a")
    store_profile(make_model("p"), "producer", 4 * GIB)
    params = PlaceParams(data={"solver": "greedy"})
    assert params.is_valid(), params.errors
    job = Job.objects.create(kind="place", params=dict(params.validated_data))
    cancel = CancelMeanwhile(placing.store_plan, job.pk)
    monkeypatch.setattr(placing, "store_plan", cancel)

    assert run_racing(job, cancel) == JobStatus.SUCCEEDED == job.status, job.error

    assert_the_cancel_came_too_late(cancel, job)
    assert PlacementPlan.objects.get(job=job).moves == result_of(job)["moves"]


def test_a_job_cancelled_before_its_outcome_is_written_stores_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner returned its profile, and the job was cancelled before it finished."""
    model = make_model("llama-3-8b")
    job = queued_profile_job()
    run = profiling.run_profile

    def run_then_cancel(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        result = run(params, ctx)
        cancel_job(Job.objects.get(pk=job.pk))
        return result

    monkeypatch.setattr("jobs.kinds.profile.run_profile", run_then_cancel)

    assert execute_job(job.pk) == JobStatus.CANCELLED

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.result is None
    assert not ModelProfile.objects.filter(model=model).exists()
