"""Celery tasks of the jobs app: thin wrappers around jobs.services."""

from __future__ import annotations

import logging
import threading
import uuid
from contextlib import suppress
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import Error, connection

from jobs import liveness, services

RETRY_BACKOFF_MAX_S = 60


@shared_task(bind=True, name="jobs.run_job", max_retries=5, ignore_result=True)
def run_job(self: Any, job_id: int, claim: str = "") -> str | None:
    """Run job ``job_id``; transient database errors are retried with backoff, and fail the job
    once the retries are used up.

    ``claim`` is this delivery's token (a new one for each message); its retries carry it, so that a
    retry takes up the job this delivery claimed and no other delivery's (services.execute_job)."""
    claim = claim or uuid.uuid4().hex
    try:
        status = services.execute_job(job_id, claim=claim)
    except services.TRANSIENT_DB_ERRORS as exc:
        countdown = get_exponential_backoff_interval(
            factor=1, retries=self.request.retries, maximum=RETRY_BACKOFF_MAX_S, full_jitter=True
        )
        if _will_retry(self):
            with suppress(Error):  # best effort: the database may be what failed
                liveness.await_retry(job_id, claim, countdown)
        elif not self.request.called_directly:
            # The retries are used up: the job would stay running until the lost-job sweep failed it
            # as "Worker lost", or, its claim failing, queued with no message left. If this write
            # fails too, the sweep still fails a running one later.
            with suppress(Error):
                services.fail_retried_out(job_id, claim, self.request.retries, exc)
        raise self.retry(exc=exc, kwargs={"claim": claim}, countdown=countdown) from exc
    return None if status is None else str(status)


def _will_retry(task: Any) -> bool:
    """Whether ``task.retry()`` sends a retry (else it raises the error: called directly, or the
    retries are used up)."""
    request = task.request
    return not request.called_directly and (task.max_retries is None or request.retries < task.max_retries)


@shared_task(name="jobs.fail_lost_jobs", ignore_result=True)
def fail_lost_jobs() -> list[int]:
    """Fail running jobs whose worker stopped sending heartbeats (scheduled by Celery beat)."""
    return liveness.fail_lost_jobs()


@worker_ready.connect
def _recover_jobs_on_start(**_: Any) -> None:
    """A (re)started worker clears what its predecessor left running, even without beat, and
    re-sends queued jobs whose messages a killed worker may have taken with it.

    A worker restarted at once (a restart policy's seconds) finds its predecessor's job not silent
    long enough to count as lost yet, so it sweeps once more when such a job would be (one waiting
    for a retry: that long after the retry is due, liveness.lost_in): from a timer
    thread of this process, not a queued task, which would wait while every pool slot runs a job
    (for hours: CELERY_TASK_TIME_LIMIT)."""
    try:
        liveness.fail_lost_jobs()
        lost_in = liveness.lost_in()
        if lost_in is not None:
            later = threading.Timer(lost_in + settings.JOBS_HEARTBEAT_S, _sweep_again)
            later.daemon = True
            later.start()
        services.requeue_queued_jobs()
    except Exception:
        logging.getLogger(__name__).exception("job recovery at worker start failed")


def _sweep_again() -> None:
    try:
        liveness.fail_lost_jobs()
    except Exception:
        logging.getLogger(__name__).exception("the delayed lost-job sweep failed")
    finally:
        connection.close()  # this thread's own connection
