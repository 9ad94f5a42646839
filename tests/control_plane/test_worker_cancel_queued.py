"""A job cancelled while queued is dropped by the REAL worker that later receives it.

Kept apart from test_worker.py: that module's shared worker would take the message first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from jobs.models import Job, JobStatus
from rest_framework.test import APIClient

from .test_worker import URL, wait_for
from .worker import CeleryWorker

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_skips_a_job_cancelled_before_a_worker_took_it(
    start_worker: Callable[[], CeleryWorker], admin_client: APIClient
) -> None:
    created = admin_client.post(URL, {"kind": "noop", "params": {"steps": 2, "delay_s": 0.0}}, format="json")
    job_id = created.data["id"]
    assert admin_client.post(f"{URL}{job_id}/cancel/").status_code == 200

    worker = start_worker()
    marker = created.data["celery_id"]
    deadline = time.monotonic() + 30
    while marker not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker in worker.log(), worker.log()  # the worker got (and dropped) the message
    follow_up = admin_client.post(
        URL, {"kind": "noop", "params": {"steps": 1, "delay_s": 0.0}}, format="json"
    )
    wait_for(follow_up.data["id"], lambda j: j.status == JobStatus.SUCCEEDED)  # it kept working

    job: Any = Job.objects.get(pk=job_id)
    assert (job.status, job.started_at, job.progress) == (JobStatus.CANCELLED, None, 0.0)
