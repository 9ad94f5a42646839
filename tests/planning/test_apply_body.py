"""POST /api/v1/plans/{job}/apply/ takes no body fields: one given (a typo of an option it does not
have) is a 400 naming it and nothing is applied, as everywhere else in the API; an empty body or
``{}`` applies."""

from __future__ import annotations

import pytest
from planning.models import PlacementPlan
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, deployment_rows, make_host, make_model, run_job_via_api, store_profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def plan_job(admin_client: APIClient) -> int:
    """A succeeded place job whose plan starts one model (nothing runs yet)."""
    make_host("solo")
    store_profile(make_model("p"), "producer", 4 * GIB)
    return run_job_via_api(admin_client, "place", {}).pk


@pytest.mark.parametrize(
    ("body", "fmt"),
    [({"dry_run": True}, "json"), ({"force": "1", "dry_run": "yes"}, "multipart")],
    ids=["json", "form"],
)
def test_an_unknown_body_field_is_a_400_naming_it_and_applies_nothing(
    admin_client: APIClient, plan_job: int, body: dict, fmt: str
) -> None:
    before = deployment_rows()
    refused = admin_client.post(f"/api/v1/plans/{plan_job}/apply/", body, format=fmt)
    assert refused.status_code == 400, refused.data
    assert refused.data == {name: ["Unknown field."] for name in body}
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job_id=plan_job).applied_at is None


@pytest.mark.parametrize("body", [None, {}], ids=["empty", "empty-object"])
def test_an_empty_body_applies(admin_client: APIClient, plan_job: int, body: dict | None) -> None:
    applied = admin_client.post(f"/api/v1/plans/{plan_job}/apply/", body, format="json")
    assert applied.status_code == 200, applied.data
    assert applied.data["applied"] is True and deployment_rows() != []
