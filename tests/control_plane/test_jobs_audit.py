"""Jobs, audited: a result that cannot be stored as JSON fails the job with that reason (instead of
leaving it running, or succeeded with a row the API cannot render); a boolean is not a number."""

from __future__ import annotations

import math
from typing import Any

import pytest
from jobs import registry
from jobs.kinds.params import StrictParams
from jobs.models import Job, JobStatus
from jobs.registry import JobContext, JobKind
from jobs.tasks import run_job
from rest_framework.test import APIClient

URL = "/api/v1/jobs/"
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        ({"rate": math.nan}, "Out of range float values are not JSON compliant"),
        ({"curve": [1.0, math.inf]}, "Out of range float values are not JSON compliant"),
        ({"when": object()}, "is not JSON serializable"),
    ],
)
def test_a_result_that_is_not_json_fails_the_job_with_the_reason(
    admin_client: APIClient, monkeypatch: pytest.MonkeyPatch, result: dict[str, Any], reason: str
) -> None:
    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        ctx.progress(0.5)
        return result

    monkeypatch.setitem(registry._KINDS, "test-bad-result", JobKind("test-bad-result", StrictParams, run))
    job = Job.objects.create(kind="test-bad-result")
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.result is None and job.finished_at is not None
    assert "result cannot be stored as JSON" in job.error and reason in job.error
    assert job.progress == 0.5
    assert admin_client.get(f"{URL}{job.pk}/").status_code == 200
    assert admin_client.get(URL).status_code == 200


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"delay_s": True}, "delay_s"),
        ({"steps": False}, "steps"),
        ({"delay_s": True, "stepz": 1}, "stepz"),  # every error at once
        ({"delay_s": True, "stepz": 1}, "delay_s"),
        ({"steps": 0, "stepz": 1}, "steps"),
        ({"steps": 0, "stepz": 1}, "stepz"),
    ],
)
def test_it_refuses_booleans_for_numbers_and_lists_every_error(
    admin_client: APIClient, params: dict[str, Any], field: str
) -> None:
    response = admin_client.post(URL, {"kind": "noop", "params": params}, format="json")
    assert response.status_code == 400
    assert field in response.data["params"]
    assert not Job.objects.exists()


def test_a_place_job_that_cannot_place_says_why_without_a_traceback() -> None:
    # No registered model: the placer's PlacementError is the operator's to act on, not a bug.
    job = Job.objects.create(kind="place", params={})
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error == "PlacementError: no registered models to place"


def test_a_job_that_fails_unexpectedly_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        raise KeyError("oops")

    monkeypatch.setitem(registry._KINDS, "test-bug", JobKind("test-bug", StrictParams, run))
    job = Job.objects.create(kind="test-bug")
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error.startswith("KeyError: 'oops'") and "Traceback (most recent call last)" in job.error


def test_a_job_of_a_kind_this_worker_does_not_have_fails_saying_so() -> None:
    job = Job.objects.create(kind="retired-kind")  # e.g. a worker running older code in a rollout
    assert run_job(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error == "Unknown job kind 'retired-kind': this worker does not run it."
