"""Job operations: create (and enqueue once committed), execute in a worker, cancel.

Every status change is a conditional UPDATE on the row (``WHERE status IN ...``), so a cancel
racing a worker's progress or completion write always leaves one consistent outcome: once a job
is cancelled, nothing the worker does afterwards changes its status, progress or result.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from typing import Any

from accounts.services import lock_owner
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.db.models import Q
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from core.unavailable import BrokerUnavailable
from jobs.liveness import Heartbeat, beat, worker_name
from jobs.models import ACTIVE_STATUSES, Job, JobStatus
from jobs.registry import JobCancelled, JobContext, JobKind, get_kind

logger = logging.getLogger(__name__)

# A runner reporting thousands of tiny steps should not turn into thousands of writes.
PROGRESS_WRITE_INTERVAL_S = 0.2
ERROR_TEXT_LIMIT = 10_000
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)
# What publishing raises when the broker cannot take a message: kombu's OperationalError (Redis
# unreachable, after Celery's publish retries), OSError (the embedded filesystem broker's folders).
BROKER_ERRORS = (KombuOperationalError, OSError)


class JobNotActive(Exception):
    """The job already finished (succeeded, failed or was cancelled)."""


def create_job(kind: str, params: dict[str, Any], user: Any | None) -> Job:
    """Store a queued job and send it to the workers once the row is committed.

    ``params`` must already be validated by the kind's params serializer. The kind's ``admit``
    (if any) runs in the same transaction as the insert and may refuse the job (``JobRefused``;
    nothing is written). The message goes out when the row commits, never before: a worker never
    receives a job whose row it cannot read yet, and a message the broker does not take withdraws
    the row. Called outside any transaction (the API and the dashboard: no ATOMIC_REQUESTS), that
    is at the end of this call, and a refusal is raised here. Called inside a caller's transaction,
    the message goes out when the caller's outermost block commits (nothing if it rolls back); a
    refusal then still withdraws the row, but is only logged: this call has returned.

    Raises:
        OwnerGone: ``user`` was deleted meanwhile; nothing was written.
        BrokerUnavailable: the broker did not take the message; the row was deleted again.
    """
    job_kind = get_kind(kind)  # KeyError for an unknown kind: callers validate first
    unsent: list[Exception] = []
    with transaction.atomic():
        if user is not None:
            # A delete of the user (which locks the row first) then runs before or after the insert,
            # not between its cascade and its commit: the insert would fail there (IntegrityError).
            lock_owner(user)
        if job_kind.admit is not None:
            job_kind.admit(params)
        job = Job.objects.create(kind=kind, params=params, created_by=user, celery_id=str(uuid.uuid4()))
        # Not raised from the hook: Django runs hooks in the middle of leaving the block.
        transaction.on_commit(partial(_send_or_withdraw, job.pk, job.celery_id, unsent))
    if unsent:
        error = unsent[0]
        if isinstance(error, BROKER_ERRORS):
            message = "The job queue cannot take jobs right now; no job was created."
            raise BrokerUnavailable(message) from error
        raise error
    return job


def _send_or_withdraw(job_id: int, celery_id: str, unsent: list[Exception]) -> None:
    """Send the new job's message; if that fails, delete the job unless a worker took it already
    (a message sent before the failure was reported) and note the error in ``unsent``."""
    from jobs.tasks import run_job

    try:
        run_job.apply_async(args=(job_id,), task_id=celery_id)
    except Exception as exc:
        if Job.objects.filter(pk=job_id, status=JobStatus.QUEUED).delete()[0]:
            logger.warning("could not enqueue new job %s; deleted it", job_id, exc_info=True)
            unsent.append(exc)


def _enqueue(job_id: int, celery_id: str) -> None:
    """Send a stored job's message again; if the broker cannot take it, fail the job."""
    from jobs.tasks import run_job

    try:
        run_job.apply_async(args=(job_id,), task_id=celery_id)
    except Exception as exc:
        logger.exception("could not enqueue job %s", job_id)
        Job.objects.filter(pk=job_id, status=JobStatus.QUEUED).update(
            status=JobStatus.FAILED, error=f"Could not enqueue the job: {exc}", finished_at=timezone.now()
        )


def requeue_queued_jobs() -> list[int]:
    """Send every queued job to the workers again; returns their ids.

    A Celery worker acknowledges a message when it reserves it, before the job starts (and kombu's
    filesystem broker deletes the message then): a worker killed with jobs reserved takes their
    messages with it, and those jobs would stay queued forever. Called when a worker starts, this
    gives every queued job a fresh message. A second message for a job is harmless: the claim in
    `execute_job` is conditional on the job being queued, so the first delivery runs it and any
    other finds it taken and skips it.
    """
    ids = list(Job.objects.filter(status=JobStatus.QUEUED).order_by("pk").values_list("pk", "celery_id"))
    for job_id, celery_id in ids:
        _enqueue(job_id, celery_id or str(uuid.uuid4()))
    return [job_id for job_id, _ in ids]


def cancel_job(job: Job) -> Job:
    """Cancel a queued or running job; ``JobNotActive`` if it already finished.

    The row changes at once; a running worker notices at its next cancellation point and stops.
    The Celery task is also revoked so that a worker that has not started it drops it.
    """
    updated = Job.objects.filter(pk=job.pk, status__in=ACTIVE_STATUSES).update(
        status=JobStatus.CANCELLED, finished_at=timezone.now()
    )
    job.refresh_from_db()
    if not updated:
        raise JobNotActive(f"job {job.pk} is already {job.status}")
    if job.celery_id:
        transaction.on_commit(partial(_revoke, job.celery_id))
    return job


def _revoke(celery_id: str) -> None:
    from config.celery import app

    try:
        app.control.revoke(celery_id)
    except Exception:
        # Best effort: the status check between steps is what actually stops the job.
        logger.warning("could not broadcast revoke for task %s", celery_id, exc_info=True)


class _RowContext(JobContext):
    """Progress and cancellation through the job's row."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.latest = 0.0  # the last fraction reported, written or not
        self._last_write = 0.0
        self.outcome: list[Callable[[], object]] = []  # on_success writes, in registration order

    def progress(self, fraction: float) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
        self.latest = fraction
        now = time.monotonic()
        if now - self._last_write < PROGRESS_WRITE_INTERVAL_S and fraction < 1.0:
            self.check_cancelled()
            return
        self._last_write = now
        if not Job.objects.filter(pk=self.job_id, status=JobStatus.RUNNING).update(progress=fraction):
            raise JobCancelled(self.job_id)

    def check_cancelled(self) -> None:
        if not Job.objects.filter(pk=self.job_id, status=JobStatus.RUNNING).exists():
            raise JobCancelled(self.job_id)

    def on_success(self, write: Callable[[], object]) -> None:
        self.outcome.append(write)


def execute_job(job_id: int, *, claim: str = "") -> JobStatus | None:
    """Run a job in this (worker) process; returns its final status, ``None`` if not run.

    A job runs only if it is queued, or running under ``claim``: the token of the delivery that
    claimed it, which its Celery retries carry (jobs.tasks.run_job). A job may have several
    messages (`requeue_queued_jobs`); one whose claim failed on a transient error is retried too,
    and with "a retry takes up a running job" alone it ran the job a second time, beside the
    delivery running it. While the job runs, a heartbeat thread shows the worker is alive
    (jobs/liveness.py). Errors from the runner are recorded as ``failed`` with the error text;
    transient database errors are re-raised so the task's retry policy applies.
    """
    claimable = Q(status=JobStatus.QUEUED)
    if claim:
        claimable |= Q(status=JobStatus.RUNNING, claim=claim)
    now = timezone.now()
    # A run starts from the beginning: a retry's too, whose earlier run's progress would otherwise
    # show (the API, the dashboard's bar) until the new run's first report.
    claimed = Job.objects.filter(claimable, pk=job_id).update(
        status=JobStatus.RUNNING,
        started_at=now,
        progress=0.0,
        error="",
        worker=worker_name(),
        heartbeat_at=now,
        claim=claim,
    )
    if not claimed:
        logger.info("job %s is not queued (cancelled, finished or missing); skipping", job_id)
        return None
    job = Job.objects.get(pk=job_id)
    try:
        kind = get_kind(job.kind)
    except KeyError:  # a kind this worker's code does not have (removed, or an older worker)
        error = f"Unknown job kind {job.kind!r}: this worker does not run it."
        return _finish(job_id, status=JobStatus.FAILED, error=error)
    ctx = _RowContext(job_id)
    try:
        with Heartbeat(job_id):
            result = kind.run(job.params, ctx)
    except JobCancelled:
        return _stopped(job_id)
    except TRANSIENT_DB_ERRORS:
        raise
    except Exception as exc:
        return _fail(job_id, kind, exc, ctx.latest)
    try:
        # Strict JSON, as the API renders it: NaN, infinities or objects would fail the write (and
        # leave the job running until it is swept as lost) or be stored and break every read.
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        error = f"The job finished but its result cannot be stored as JSON: {exc}"
        return _finish(job_id, status=JobStatus.FAILED, error=error, progress=ctx.latest)
    # The heartbeat ends with the run, and a long save (a large plan or profile) is silent: while
    # the save holds the row locked the sweep skips the job (liveness.fail_lost_jobs), and a save
    # that fails on a transient error stamps it (then jobs.tasks.run_job with the time its retry is
    # due). Without either, such a job was failed as lost while its worker went on to retry it.
    try:
        return _succeed(job_id, result, ctx.outcome)
    except JobCancelled:
        return _stopped(job_id)
    except TRANSIENT_DB_ERRORS:
        with suppress(DatabaseError):  # best effort: the database may be what failed
            beat(job_id)
        raise
    except Exception as exc:  # from an outcome write: nothing of it was kept
        return _fail(job_id, kind, exc, ctx.latest)


def fail_retried_out(job_id: int, claim: str, retries: int, exc: Exception) -> bool:
    """Fail job ``job_id`` whose delivery ``claim`` hit the transient database error ``exc`` after
    ``retries`` Celery retries (jobs.tasks.run_job: none are left): in its run (running under that
    claim), or in its claim (still queued: no delivery has claimed it). False when it is neither
    (finished, cancelled, or another delivery runs it).

    A queued one is failed too: with its delivery gone nothing would take it up (only a worker
    start re-sends queued jobs), as a running one's does. Another message of the job, still on its
    way, then finds it failed and skips it; one that claimed it first keeps it (the update matches
    neither)."""
    error = f"Failed after {retries} retries on a database error: {type(exc).__name__}: {exc}"
    ours = Q(status=JobStatus.RUNNING, claim=claim) | Q(status=JobStatus.QUEUED)
    updated = Job.objects.filter(ours, pk=job_id).update(
        status=JobStatus.FAILED, error=error[:ERROR_TEXT_LIMIT], finished_at=timezone.now()
    )
    if updated:
        logger.error("job %s failed: %s", job_id, error)
    return bool(updated)


def _fail(job_id: int, kind: JobKind, exc: Exception, progress: float) -> JobStatus:
    """Record ``exc``, raised by the runner or its outcome write, as the job's failure."""
    if isinstance(exc, kind.expected_errors):  # why the job cannot be done: the operator's to act on
        logger.info("job %s failed: %s", job_id, exc)
        text = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]
    else:
        logger.error("job %s failed unexpectedly", job_id, exc_info=exc)
        trace = "".join(traceback.format_exception(exc))
        text = f"{type(exc).__name__}: {exc}\n\n{trace}"[:ERROR_TEXT_LIMIT]
    return _finish(job_id, status=JobStatus.FAILED, error=text, progress=progress)


@transaction.atomic
def _succeed(job_id: int, result: Any, outcome: list[Callable[[], object]]) -> JobStatus:
    """Apply the runner's outcome writes and mark the job succeeded, in one transaction, only if
    the job still runs: under its row lock (PostgreSQL; SQLite's immediate transactions serialise
    writers), so a cancel either came first (nothing is applied) or waits and finds it succeeded.
    With the writes in a transaction of their own, a cancel between it and the status write left
    a cancelled job whose profile had become its model's current one."""
    if not Job.objects.select_for_update().filter(pk=job_id, status=JobStatus.RUNNING).exists():
        return _stopped(job_id)  # cancelled (or failed as lost) after its last step
    for write in outcome:
        write()
    return _finish(job_id, status=JobStatus.SUCCEEDED, progress=1.0, result=result)


def _finish(job_id: int, *, status: JobStatus, **fields: Any) -> JobStatus:
    updated = Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).update(
        status=status, finished_at=timezone.now(), **fields
    )
    if not updated:
        return _stopped(job_id)  # cancelled (or failed as lost) between the last step and this write
    return status


def _stopped(job_id: int) -> JobStatus:
    """The job no longer runs under this worker: log what it became, and return that.

    Cancelled by a user, or failed as lost by the sweep (jobs/liveness.py) while this worker was
    alive but silent: this worker's log line and the task's outcome said "cancelled" for both.
    Either way nothing of its run is kept."""
    status = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
    if status is None:
        logger.info("job %s was deleted; stopped", job_id)
        return JobStatus.CANCELLED
    if status == JobStatus.FAILED:
        message = "job %s was failed as lost while this worker still ran it; stopped, nothing of it kept"
        logger.warning(message, job_id)
    else:
        logger.info("job %s %s; stopped", job_id, status)
    return JobStatus(status)
