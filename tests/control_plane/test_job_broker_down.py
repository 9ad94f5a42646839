"""Starting a job while the Celery broker cannot take it: a JSON 503 with Retry-After and no job
row, rather than a 201 for a job that then fails with "Could not enqueue the job" (the dashboard's
form: tests/dashboard/test_dashboard_job_broker_down.py).

Transactional tests: the message goes out when the job's row commits, which the rolled-back
transaction of an ordinary test never does.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from jobs import services
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from kombu.exceptions import OperationalError as KombuOperationalError
from rest_framework.test import APIClient

from core.unavailable import BrokerUnavailable

URL = "/api/v1/jobs/"
pytestmark = pytest.mark.django_db(transaction=True)
# What publishing raises with REDIS_URL pointing at a Redis that refuses connections.
REDIS_REFUSED = KombuOperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


@pytest.fixture
def broker_refuses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Publishing fails as with Redis down; returns the job ids it was asked to send."""
    return refuse_jobs(monkeypatch)


def refuse_jobs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make publishing fail as with Redis down; returns the job ids it was asked to send."""
    asked: list[int] = []

    def refuse(args: tuple[int], task_id: str) -> None:
        asked.append(args[0])
        raise REDIS_REFUSED

    monkeypatch.setattr(run_job, "apply_async", refuse)
    return asked


@pytest.fixture
def embedded_broker_gone() -> Iterator[None]:
    """The embedded (filesystem) broker's queue folder is missing: a real publish fails."""
    if settings.REDIS_URL:
        pytest.skip("the embedded broker's folders are not in use with REDIS_URL")
    queue = Path(settings.BROKER_DIR) / "queue"
    aside = queue.with_name(queue.name + "-aside")
    queue.rename(aside)
    try:
        yield
    finally:
        shutil.rmtree(queue, ignore_errors=True)
        aside.rename(queue)


def test_the_api_answers_503_with_retry_after_and_keeps_no_job(
    admin_client: APIClient, broker_refuses: list[int]
) -> None:
    response = admin_client.post(URL, {"kind": "noop", "params": {"steps": 3}}, format="json")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    assert response.json()["detail"] == "The job queue cannot take jobs right now; no job was created."
    assert len(broker_refuses) == 1  # it was sent after the row was stored, and then withdrawn
    assert not Job.objects.exists()


def test_a_real_publish_to_a_missing_broker_folder_is_a_503_too(
    admin_client: APIClient, embedded_broker_gone: None
) -> None:
    response = admin_client.post(URL, {"kind": "noop"}, format="json")
    assert (response.status_code, response["Retry-After"]) == (503, "5")
    assert not Job.objects.exists()


def test_a_job_a_worker_already_took_is_kept_although_the_send_reported_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message can reach the broker before the error is reported (a timeout): the job stays."""

    def sent_then_failed(args: tuple[int], task_id: str) -> None:
        Job.objects.filter(pk=args[0]).update(status=JobStatus.RUNNING)  # a worker claimed it
        raise REDIS_REFUSED

    monkeypatch.setattr(run_job, "apply_async", sent_then_failed)
    job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_another_publish_error_withdraws_the_job_and_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise TypeError("cannot serialize")

    monkeypatch.setattr(run_job, "apply_async", broken)
    with pytest.raises(TypeError, match="cannot serialize"):
        services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert not Job.objects.exists()


def test_the_broker_error_is_kept_as_the_cause(broker_refuses: list[int]) -> None:
    with pytest.raises(BrokerUnavailable) as raised:
        services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert raised.value.__cause__ is REDIS_REFUSED


def test_a_job_created_inside_a_callers_transaction_is_sent_when_that_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nesting is allowed (it raised "A durable atomic block cannot be nested"); the message waits
    for the caller's commit, and a rolled-back caller sends nothing."""
    sent: list[int] = []
    monkeypatch.setattr(run_job, "apply_async", lambda args, task_id: sent.append(args[0]))
    with transaction.atomic():
        job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
        assert sent == []
    assert sent == [job.pk]
    with transaction.atomic():
        services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
        transaction.set_rollback(True)
    assert sent == [job.pk]
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]


def test_a_refusal_at_the_callers_commit_still_withdraws_the_job(broker_refuses: list[int]) -> None:
    with transaction.atomic():
        job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert broker_refuses == [job.pk]
    assert not Job.objects.exists()
