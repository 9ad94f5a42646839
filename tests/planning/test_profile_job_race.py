"""Audit of a production-shaped deployment: concurrent posts of profile jobs for one model.

The "one active profile job per model" check ran only in the params serializer, before the job's
row was written: posts that arrived together all passed it, and on PostgreSQL five profile jobs of
one model were created within 2 ms and ran at the same time. The check now runs again in the
transaction that stores the job, under the model's row lock.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from django.db import connection
from jobs import services
from jobs.api.serializers import JobSerializer
from jobs.kinds import profile
from jobs.models import Job
from jobs.registry import JobRefused
from rest_framework.test import APIClient

from tests.control_plane.conftest import token_client
from tests.planning.helpers import make_model

URL = "/api/v1/jobs/"
PARAMS = {"model": "llama-3-8b", "preset_gpu": "h100"}


def _validated() -> dict[str, Any]:
    serializer = JobSerializer(data={"kind": "profile", "params": PARAMS})
    assert serializer.is_valid(), serializer.errors
    return dict(serializer.validated_data)


@pytest.mark.django_db
def test_a_profile_job_validated_before_another_was_stored_is_refused_when_stored(alice: Any) -> None:
    make_model("llama-3-8b")
    first, second = _validated(), _validated()  # both checked while no profile job exists

    job = services.create_job(first["kind"], first["params"], alice)
    with pytest.raises(JobRefused) as refused:
        services.create_job(second["kind"], second["params"], alice)

    assert refused.value.errors == {
        "model": [f"Profile job {job.pk} of this model is already queued; wait for it or cancel it."]
    }
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]  # nothing half-written


@pytest.mark.django_db
def test_a_profile_job_of_a_model_deleted_after_validation_is_not_stored(alice: Any) -> None:
    model = make_model("llama-3-8b")
    data = _validated()
    model.delete()

    with pytest.raises(JobRefused) as refused:
        services.create_job(data["kind"], data["params"], alice)

    assert refused.value.errors == {"model": ["No served model named 'llama-3-8b'."]}
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_of_profile_jobs_for_one_model_create_one_job(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_model("llama-3-8b")
    parties = 3
    all_validated = threading.Barrier(parties)
    validate = profile.ProfileParams.validate

    def validate_in_lockstep(self: Any, attrs: dict[str, Any]) -> dict[str, Any]:
        # Every post finds no active profile job before any of them stores its own.
        out = validate(self, attrs)
        with contextlib.suppress(threading.BrokenBarrierError):
            all_validated.wait(timeout=5.0)
        return out

    monkeypatch.setattr(profile.ProfileParams, "validate", validate_in_lockstep)
    clients = [token_client(alice) for _ in range(parties)]
    answers: list[tuple[int, Any]] = []

    def post(client: APIClient) -> None:
        try:
            response = client.post(URL, {"kind": "profile", "params": PARAMS}, format="json")
            answers.append((response.status_code, response.data))
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert sorted(code for code, _ in answers) == [201] + [400] * (parties - 1), answers
    (job,) = Job.objects.all()
    for code, data in answers:
        if code == 400:
            assert data == {
                "params": {
                    "model": [
                        f"Profile job {job.pk} of this model is already queued; wait for it or cancel it."
                    ]
                }
            }
