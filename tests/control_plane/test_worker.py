"""Jobs run by a REAL Celery worker subprocess on the configured broker.

Embedded default: kombu's filesystem broker and a file-based SQLite test database the worker
opens too. With REDIS_URL / DATABASE_URL set (CI's second pass), the same tests run on Redis and
PostgreSQL. Transactional tests, so that the rows are committed where the worker can see them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from django.conf import settings
from jobs.models import Job, JobStatus
from rest_framework.test import APIClient

from .worker import CeleryWorker

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/api/v1/jobs/"


def wait_for(job_id: int, predicate: Callable[[Job], bool], timeout_s: float = 60.0) -> Job:
    deadline = time.monotonic() + timeout_s
    while True:
        job = Job.objects.get(pk=job_id)
        if predicate(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} stuck at {job.status} (progress {job.progress})")
        time.sleep(0.1)


def test_it_uses_the_configured_broker() -> None:
    # With CELERY_BROKER_URL=amqp://... these tests run on RabbitMQ (they all passed there).
    default = "redis" if settings.REDIS_URL else "filesystem"
    expected = os.environ.get("CELERY_BROKER_URL", "").strip() or default
    assert settings.CELERY_BROKER_URL.startswith(expected)


def test_it_runs_a_noop_job_to_completion(module_worker: CeleryWorker, admin_client: APIClient) -> None:
    created = admin_client.post(URL, {"kind": "noop", "params": {"steps": 4, "delay_s": 0.2}}, format="json")
    assert created.status_code == 201
    seen_progress: set[float] = set()

    def finished(job: Job) -> bool:
        seen_progress.add(job.progress)
        return not job.is_active

    job = wait_for(created.data["id"], finished)
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert job.result == {"steps_done": 4}
    assert job.progress == 1.0
    assert any(0 < p < 1 for p in seen_progress), seen_progress  # progress was visible mid-run
    assert job.started_at is not None and job.finished_at is not None
    fetched = admin_client.get(f"{URL}{job.pk}/").data
    assert (fetched["status"], fetched["celery_id"]) == ("succeeded", job.celery_id)


def test_it_records_a_failure_from_the_worker(module_worker: CeleryWorker, admin_client: APIClient) -> None:
    params = {"steps": 3, "delay_s": 0.0, "fail_at_step": 2}
    created = admin_client.post(URL, {"kind": "noop", "params": params}, format="json")
    job = wait_for(created.data["id"], lambda j: not j.is_active)
    assert job.status == JobStatus.FAILED
    assert "RuntimeError: noop failed at step 2" in job.error


def test_it_cancels_a_running_job(module_worker: CeleryWorker, admin_client: APIClient) -> None:
    created = admin_client.post(
        URL, {"kind": "noop", "params": {"steps": 200, "delay_s": 0.1}}, format="json"
    )
    job_id = created.data["id"]
    wait_for(job_id, lambda j: j.status == JobStatus.RUNNING and j.progress > 0)

    cancelled = admin_client.post(f"{URL}{job_id}/cancel/")
    assert cancelled.status_code == 200
    progress_at_cancel = Job.objects.get(pk=job_id).progress

    time.sleep(1.0)  # several steps' worth: a worker that ignored the cancel would move on
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.CANCELLED
    assert job.progress == progress_at_cancel < 1.0
    assert job.result is None

    # The revoke broadcast reached the worker through the broker's fanout exchange.
    deadline = time.monotonic() + 15
    while "revoked" not in module_worker.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"Tasks flagged as revoked: {job.celery_id}" in module_worker.log()
