"""Jobs whose worker died: a heartbeat while a job runs, and a sweep that fails the silent ones.

A worker killed mid-job (SIGKILL, OOM, a lost machine) cannot write the outcome, so without this
its job would stay "running" forever. While a job runs, a thread of the worker stamps the row's
``heartbeat_at`` every ``JOBS_HEARTBEAT_S``; ``fail_lost_jobs`` marks a running job failed once its
last stamp is older than ``JOBS_LOST_AFTER_S``. The sweep runs on Celery beat (see settings) and
once whenever a worker starts, and again ``JOBS_LOST_AFTER_S`` later if jobs were running then (a
worker restarted at once cannot tell its predecessor's job is lost yet). A job waiting for a Celery
retry is stamped with the time the retry is due (``await_retry``). Both writes are
conditional on ``status=running``, so a job that finishes or is cancelled meanwhile keeps its own
outcome. The sweep skips a job whose outcome is being saved (its row locked by the save), however
long that takes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime, timedelta
from types import TracebackType

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from jobs.models import Job, JobStatus

logger = logging.getLogger(__name__)


def worker_name() -> str:
    """This process as the job's ``worker``: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def beat(job_id: int) -> bool:
    """Stamp a running job's heartbeat; False when it no longer runs."""
    return bool(Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).update(heartbeat_at=timezone.now()))


class Heartbeat:
    """``with Heartbeat(job_id):`` stamps the job's row from a thread until the block ends."""

    def __init__(self, job_id: int, interval_s: float | None = None) -> None:
        self.job_id = job_id
        self.interval_s = float(settings.JOBS_HEARTBEAT_S if interval_s is None else interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"job-{job_id}-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=max(self.interval_s, 5.0))

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    if not beat(self.job_id):
                        return  # finished, cancelled or failed as lost: nothing left to stamp
                except DatabaseError:
                    logger.warning("heartbeat of job %s not written", self.job_id, exc_info=True)
        finally:
            connection.close()  # this thread's own connection


def await_retry(job_id: int, claim: str, countdown_s: float) -> bool:
    """Stamp a job that a Celery retry of its delivery ``claim`` takes up in ``countdown_s`` with
    the time that retry is due; False when the job no longer runs under that claim.

    Nothing beats while the retry waits, so the sweep's ``JOBS_LOST_AFTER_S`` counts from the time
    the retry is due, not from the run's last beat: with the limit below the countdown plus a
    heartbeat interval, a job merely waiting for its retry was failed as lost. A retry that never
    comes (its worker killed meanwhile) still is, that long after it was due. A duplicate message's
    retry (another delivery runs the job) leaves the job's stamp alone."""
    due = timezone.now() + timedelta(seconds=countdown_s)
    running = Job.objects.filter(pk=job_id, status=JobStatus.RUNNING, claim=claim)
    return bool(running.update(heartbeat_at=due))


def lost_in() -> float | None:
    """Seconds until every job running now, if nothing stamps it again, is silent long enough to
    be failed as lost: ``JOBS_LOST_AFTER_S`` from now or, for a job waiting for a retry (stamped
    with the time it is due: ``await_retry``), from then; None when no job runs."""
    running = Job.objects.filter(status=JobStatus.RUNNING)
    if not running.exists():
        return None
    latest = running.aggregate(latest=Max("heartbeat_at"))["latest"]
    ahead_s = 0.0 if latest is None else max((latest - timezone.now()).total_seconds(), 0.0)
    return ahead_s + settings.JOBS_LOST_AFTER_S


def fail_lost_jobs(now: datetime | None = None) -> list[int]:
    """Fail every running job silent for longer than ``JOBS_LOST_AFTER_S``; returns their ids."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.JOBS_LOST_AFTER_S)
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    failed = []
    for job in Job.objects.filter(silent, status=JobStatus.RUNNING).only("id", "worker", "heartbeat_at"):
        last = job.heartbeat_at.isoformat() if job.heartbeat_at else "its start"
        error = (
            f"Worker lost: no heartbeat from {job.worker or 'its worker'} since {last} "
            f"(more than {settings.JOBS_LOST_AFTER_S:g} s); the job did not finish."
        )
        # Re-checked under the row's lock: a heartbeat or an outcome written since the SELECT wins.
        # A row locked by its worker is a job whose outcome is being saved (jobs.services._succeed):
        # the worker is alive however long the save takes, and no beat can land before it ends, so
        # the job is skipped, not waited for (after a save that rolled back, the wait failed it).
        with transaction.atomic():
            lost = Job.objects.select_for_update(skip_locked=True).filter(
                silent, pk=job.pk, status=JobStatus.RUNNING
            )
            updated = lost.exists() and Job.objects.filter(pk=job.pk).update(
                status=JobStatus.FAILED, error=error, finished_at=now
            )
        if updated:
            logger.warning("job %s failed: %s", job.pk, error)
            failed.append(job.pk)
    return failed
