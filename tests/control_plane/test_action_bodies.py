"""POST /api/v1/jobs/{id}/cancel/ and /api/v1/api-keys/{id}/revoke/ take no body fields: one given
(a typo of an option they do not have) is a 400 naming it and nothing is cancelled or revoked, as
everywhere else in the API (the plan's apply: tests/planning/test_apply_body.py); an empty body or
``{}`` cancels or revokes."""

from __future__ import annotations

import pytest
from accounts.models import ApiKey
from jobs import services
from jobs.models import Job, JobStatus
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

BODIES = pytest.mark.parametrize(
    ("body", "fmt"),
    [({"force": True}, "json"), ({"reason": "stuck", "force": "1"}, "multipart")],
    ids=["json", "form"],
)
EMPTY = pytest.mark.parametrize("body", [None, {}], ids=["empty", "empty-object"])


def queued_job() -> Job:
    return services.create_job("noop", {"steps": 2, "delay_s": 0.0}, None)


def live_key(client: APIClient) -> int:
    created = client.post("/api/v1/api-keys/", {"name": "ci"}, format="json")
    assert created.status_code == 201, created.data
    return created.data["id"]


@BODIES
def test_a_cancel_with_a_body_field_is_a_400_naming_it_and_cancels_nothing(
    admin_client: APIClient, body: dict, fmt: str
) -> None:
    job = queued_job()
    refused = admin_client.post(f"/api/v1/jobs/{job.pk}/cancel/", body, format=fmt)
    assert refused.status_code == 400, refused.data
    assert refused.data == {name: ["Unknown field."] for name in body}
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED


@EMPTY
def test_an_empty_body_cancels(admin_client: APIClient, body: dict | None) -> None:
    job = queued_job()
    cancelled = admin_client.post(f"/api/v1/jobs/{job.pk}/cancel/", body, format="json")
    assert cancelled.status_code == 200, cancelled.data
    assert cancelled.data["status"] == "cancelled"


@BODIES
def test_a_revoke_with_a_body_field_is_a_400_naming_it_and_revokes_nothing(
    viewer_client: APIClient, body: dict, fmt: str
) -> None:
    key_id = live_key(viewer_client)
    refused = viewer_client.post(f"/api/v1/api-keys/{key_id}/revoke/", body, format=fmt)
    assert refused.status_code == 400, refused.data
    assert refused.data == {name: ["Unknown field."] for name in body}
    assert not ApiKey.objects.get(pk=key_id).revoked


@EMPTY
def test_an_empty_body_revokes(viewer_client: APIClient, body: dict | None) -> None:
    key_id = live_key(viewer_client)
    revoked = viewer_client.post(f"/api/v1/api-keys/{key_id}/revoke/", body, format="json")
    assert revoked.status_code == 200, revoked.data
    assert revoked.data["revoked"] is True and ApiKey.objects.get(pk=key_id).revoked
