"""Celery tasks of the jobs app: thin wrappers around jobs.services."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from jobs import services


@shared_task(
    bind=True,
    name="jobs.run_job",
    autoretry_for=services.TRANSIENT_DB_ERRORS,
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=5,
    ignore_result=True,
)
def run_job(self: Any, job_id: int) -> str | None:
    """Run job ``job_id``; transient database errors are retried with backoff."""
    status = services.execute_job(job_id, retrying=self.request.retries > 0)
    return None if status is None else str(status)
