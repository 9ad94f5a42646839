"""A job whose worker dies is failed as lost, not left "running" forever (jobs/liveness.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery.apps.beat import Beat
from django.conf import settings
from django.db import OperationalError, connection
from django.test import override_settings
from django.utils import timezone
from jobs import services, tasks
from jobs.liveness import Heartbeat, fail_lost_jobs
from jobs.models import Job, JobStatus
from jobs.registry import JobContext
from jobs.services import create_job, execute_job
from jobs.tasks import fail_lost_jobs as sweep_task
from jobs.tasks import run_job
from rest_framework.test import APIClient

from config.celery import app
from tests.pg_locks import in_thread

from .test_jobs_api import job_of_a_test_kind
from .test_worker import URL, wait_for
from .worker import CeleryWorker

LOST_AFTER_S = 60.0


def _job(status: JobStatus, *, silent_s: float | None, started_s: float = 600.0) -> Job:
    now = timezone.now()
    beat = None if silent_s is None else now - timedelta(seconds=silent_s)
    return Job.objects.create(
        kind="noop",
        status=status,
        worker="gpu-box:4242",
        started_at=now - timedelta(seconds=started_s),
        heartbeat_at=beat,
    )


@pytest.mark.django_db
@override_settings(JOBS_LOST_AFTER_S=LOST_AFTER_S)
def test_it_fails_only_running_jobs_silent_for_longer_than_the_limit() -> None:
    silent = _job(JobStatus.RUNNING, silent_s=LOST_AFTER_S + 5)
    never_beat = _job(JobStatus.RUNNING, silent_s=None)
    alive = _job(JobStatus.RUNNING, silent_s=LOST_AFTER_S - 5)
    just_started = _job(JobStatus.RUNNING, silent_s=None, started_s=1.0)
    queued = _job(JobStatus.QUEUED, silent_s=None)
    done = _job(JobStatus.SUCCEEDED, silent_s=LOST_AFTER_S * 10)
    cancelled = _job(JobStatus.CANCELLED, silent_s=LOST_AFTER_S * 10)

    assert sorted(fail_lost_jobs()) == sorted([silent.pk, never_beat.pk])

    for job in (silent, never_beat):
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED and job.finished_at is not None
        assert job.error.startswith("Worker lost: no heartbeat from gpu-box:4242")
    expected = {alive: "running", just_started: "running", queued: "queued", done: "succeeded"}
    expected[cancelled] = "cancelled"
    for job, status in expected.items():
        job.refresh_from_db()
        assert job.status == status and not job.error
    assert fail_lost_jobs() == []  # nothing is failed twice


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_stamps_the_running_job_until_its_block_ends() -> None:
    job = _job(JobStatus.RUNNING, silent_s=LOST_AFTER_S * 10)
    first = job.heartbeat_at
    assert first is not None
    with Heartbeat(job.pk, interval_s=0.05):
        deadline = time.monotonic() + 10
        while Job.objects.get(pk=job.pk).heartbeat_at == first:
            assert time.monotonic() < deadline, "no heartbeat was written"
            time.sleep(0.02)
    stamped = Job.objects.get(pk=job.pk).heartbeat_at
    time.sleep(0.3)  # six intervals: a heartbeat still running would stamp again
    assert Job.objects.get(pk=job.pk).heartbeat_at == stamped


@pytest.mark.django_db(transaction=True)
@override_settings(JOBS_HEARTBEAT_S=0.1, JOBS_LOST_AFTER_S=1.0)
def test_a_job_whose_outcome_save_outlasts_the_lost_limit_is_not_failed_as_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The heartbeat stops when the runner returns, before its outcome (a plan, a profile) is saved,
    # and the sweep waited for the row the save held locked: a save longer than JOBS_LOST_AFTER_S
    # that then met a transient database error (retried by Celery) was failed as lost, by that
    # sweep (PostgreSQL) or by one during the retry's countdown, while its worker went on.
    saves: list[int] = []
    mid_save: list[list[int]] = []  # what a sweep during the save failed (PostgreSQL)
    errors: list[str] = []
    sweeps: list[threading.Thread] = []

    def save() -> None:
        saves.append(len(saves))
        if len(saves) > 1:
            return
        time.sleep(1.3)
        if connection.vendor == "postgresql":  # SQLite's sweep waits for the save's transaction
            sweeps.append(in_thread("sweep", lambda: mid_save.append(fail_lost_jobs()), errors))
            sweeps[0].join(timeout=10)
        raise OperationalError("server closed the connection unexpectedly")

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        ctx.on_success(save)
        return {}

    job = job_of_a_test_kind(monkeypatch, "slow-save", run)
    with pytest.raises(OperationalError):
        execute_job(job.pk, claim="first")
    if sweeps:
        assert not sweeps[0].is_alive(), "the sweep waited for the save"
        assert (mid_save, errors) == ([[]], [])
    assert fail_lost_jobs() == []  # beat's sweep, while the retry waits for its countdown
    assert execute_job(job.pk, claim="another delivery") is None  # the claim still guards the job
    assert execute_job(job.pk, claim="first") == JobStatus.SUCCEEDED  # the retry
    assert saves == [0, 1]


RETRY_IN_S = 30  # a retry's countdown longer than the lost limit below


@pytest.mark.django_db
@override_settings(JOBS_HEARTBEAT_S=5.0, JOBS_LOST_AFTER_S=20.0)
@pytest.mark.parametrize(
    ("swept_after_s", "outcome"),
    [
        (RETRY_IN_S - 1, JobStatus.SUCCEEDED),
        (RETRY_IN_S + 20 - 1, JobStatus.SUCCEEDED),
        (RETRY_IN_S + 20 + 1, JobStatus.FAILED),  # the retry never came (its worker was killed)
    ],
)
def test_a_job_waiting_for_its_retry_is_failed_as_lost_only_that_long_after_the_retry_is_due(
    monkeypatch: pytest.MonkeyPatch, swept_after_s: float, outcome: JobStatus
) -> None:
    # Nothing beats while a job waits for its Celery retry (a transient database error), and the
    # sweep counted JOBS_LOST_AFTER_S from the run's last beat: with the limit below the retry's
    # countdown plus a heartbeat interval, a job merely waiting for its retry was failed as lost.
    monkeypatch.setattr(tasks, "get_exponential_backoff_interval", lambda **_: RETRY_IN_S)
    claims: list[int] = []
    swept: list[int] = []
    real_worker_name = services.worker_name

    def worker_name() -> str:  # evaluated by each claim's UPDATE: the retry's, once it is due
        if claims:  # beat's sweep, swept_after_s after the run failed
            swept.extend(fail_lost_jobs(now=timezone.now() + timedelta(seconds=swept_after_s)))
        claims.append(len(claims))
        return real_worker_name()

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        if len(claims) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return {}

    monkeypatch.setattr(services, "worker_name", worker_name)
    job = job_of_a_test_kind(monkeypatch, "flaky", run, celery_id="c-1")
    run_job.apply(args=(job.pk,), task_id=job.celery_id)
    job.refresh_from_db()
    assert (claims, job.status) == ([0, 1], outcome), job.error
    assert swept == ([] if outcome == JobStatus.SUCCEEDED else [job.pk])


@pytest.mark.django_db
@override_settings(JOBS_HEARTBEAT_S=5.0, JOBS_LOST_AFTER_S=20.0)
def test_a_worker_started_while_a_job_waits_for_its_retry_sweeps_again_once_the_retry_is_overdue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without beat, the starting worker's one later sweep is all that fails a job whose retry went
    # with its killed worker: it must come after the retry was due, plus the lost limit.
    timers: list[float] = []

    class Timer:  # records when the later sweep would run; runs nothing
        def __init__(self, interval: float, function: Callable[[], None]) -> None:
            timers.append(interval)
            self.daemon = False

        def start(self) -> None:
            pass

    monkeypatch.setattr(tasks.threading, "Timer", Timer)
    job = _job(JobStatus.RUNNING, silent_s=0.0)
    tasks._recover_jobs_on_start()
    assert timers == [pytest.approx(20.0 + 5.0, abs=1.0)]  # a running job: the limit, a beat later

    due = timezone.now() + timedelta(seconds=RETRY_IN_S)
    Job.objects.filter(pk=job.pk).update(heartbeat_at=due)  # its retry's stamp (liveness.await_retry)
    tasks._recover_jobs_on_start()
    assert timers[1:] == [pytest.approx(RETRY_IN_S + 20.0 + 5.0, abs=1.0)]


@pytest.mark.django_db
@pytest.mark.parametrize("noticed", ["at a progress report", "as it saves its outcome"])
def test_a_worker_whose_job_was_failed_as_lost_says_so_not_that_it_was_cancelled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, noticed: str
) -> None:
    # A worker alive but silent (a stalled heartbeat) whose job the sweep failed as lost logged
    # "job N cancelled; stopped" and returned cancelled (Celery's line for the task too) when it
    # noticed: nobody cancelled it.
    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        later = timezone.now() + timedelta(seconds=settings.JOBS_LOST_AFTER_S + 1)
        assert fail_lost_jobs(now=later) == [params["job"]]
        if noticed == "at a progress report":
            ctx.progress(0.5)
        return {}

    job = job_of_a_test_kind(monkeypatch, "stalled", run)
    with caplog.at_level("INFO", logger="jobs.services"):
        assert execute_job(job.pk) == JobStatus.FAILED
    said = [r.getMessage() for r in caplog.records if r.name == "jobs.services"]
    assert said == [
        f"job {job.pk} was failed as lost while this worker still ran it; stopped, nothing of it kept"
    ]
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.error.startswith("Worker lost") and job.result is None


@pytest.mark.django_db(transaction=True)
def test_running_a_job_records_its_worker_and_a_heartbeat() -> None:
    job = create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert execute_job(job.pk) == JobStatus.SUCCEEDED
    job.refresh_from_db()
    assert ":" in job.worker and job.heartbeat_at is not None and job.started_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_worker_is_killed_is_failed_by_the_next_worker(
    start_worker: Callable[..., CeleryWorker], admin_client: APIClient
) -> None:
    quick = {"JOBS_HEARTBEAT_S": "0.2", "JOBS_LOST_AFTER_S": "2"}
    doomed = start_worker(**quick)
    created = admin_client.post(
        URL, {"kind": "noop", "params": {"steps": 600, "delay_s": 0.1}}, format="json"
    )
    job_id = created.data["id"]
    wait_for(job_id, lambda j: j.status == JobStatus.RUNNING and j.progress > 0)
    beats = Job.objects.get(pk=job_id).heartbeat_at
    wait_for(job_id, lambda j: j.heartbeat_at != beats)  # the worker is alive and stamping

    behind = admin_client.post(URL, {"kind": "noop", "params": {"steps": 1, "delay_s": 0.0}}, format="json")
    time.sleep(0.5)  # the doomed worker may reserve it (and take its message along when it dies)
    doomed.kill()
    time.sleep(2.5)  # longer than JOBS_LOST_AFTER_S: the job is now silent enough to be lost
    assert Job.objects.get(pk=job_id).status == JobStatus.RUNNING  # nothing recovers it by itself

    start_worker(**quick)  # sweeps once on start
    job = wait_for(job_id, lambda j: j.status != JobStatus.RUNNING, timeout_s=60)
    assert job.status == JobStatus.FAILED and job.error.startswith("Worker lost"), job.error
    assert job.progress < 1.0

    # The job queued behind it runs, whether or not the killed worker had reserved its message.
    assert wait_for(behind.data["id"], lambda j: not j.is_active).status == JobStatus.SUCCEEDED
    # The new worker runs jobs as usual (the sweep did not take it down).
    created = admin_client.post(URL, {"kind": "noop", "params": {"steps": 2, "delay_s": 0.0}}, format="json")
    assert wait_for(created.data["id"], lambda j: not j.is_active).status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_worker_restarted_at_once_fails_its_predecessors_job_once_it_is_silent_long_enough(
    start_worker: Callable[..., CeleryWorker],
) -> None:
    # A restart policy starts the next worker seconds after one is killed: at its start the killed
    # worker's job still looks alive (its last heartbeat is recent), and without beat nothing swept
    # again, so the job stayed "running" for good.
    job = _job(JobStatus.RUNNING, silent_s=0.0)
    with Heartbeat(job.pk, interval_s=0.1):  # the predecessor stamps it until the new worker is up
        start_worker(JOBS_HEARTBEAT_S="0.2", JOBS_LOST_AFTER_S="2")
    job = wait_for(job.pk, lambda j: j.status != JobStatus.RUNNING, timeout_s=20)
    assert job.status == JobStatus.FAILED and job.error.startswith("Worker lost"), job.error


@pytest.mark.django_db(transaction=True)
def test_a_starting_worker_runs_queued_jobs_whose_messages_were_lost(
    start_worker: Callable[..., CeleryWorker],
) -> None:
    # A queued row with no message on the broker: what a worker killed with the job reserved
    # (acknowledged, not started) leaves behind.
    stranded = Job.objects.create(kind="noop", params={"steps": 1, "delay_s": 0.0}, celery_id="lost-1")
    done = Job.objects.create(kind="noop", status=JobStatus.SUCCEEDED, celery_id="done-1")
    start_worker()
    assert wait_for(stranded.pk, lambda j: not j.is_active, timeout_s=60).status == JobStatus.SUCCEEDED
    done.refresh_from_db()
    assert done.status == JobStatus.SUCCEEDED and done.started_at is None  # finished jobs stay as they are


def test_beat_schedules_the_sweep() -> None:
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert sweep_task.name in scheduled


def test_beat_started_as_the_readme_says_keeps_its_schedule_under_var_dir() -> None:
    # `celery -A config.celery beat` (no --schedule) wrote celerybeat-schedule.* into the working
    # directory: the checkout's root, or the image's /app, which its user 10001 cannot write.
    assert Beat(app=app).schedule == str(settings.VAR_DIR / "celerybeat-schedule")
