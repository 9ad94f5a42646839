"""A plan that would change no deployment (a place job run when the deployments are already where it
places them, or one whose moves were made since by hand) says so and offers no Apply; an Apply of it
through the API (or a page loaded before) is still harmless: it changes nothing."""

from __future__ import annotations

import pytest
from django.test import Client
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.models import PlacementPlan
from rest_framework.test import APIClient

from tests.dashboard.test_dashboard_results import place_job  # noqa: F401  (the fixture)
from tests.planning.helpers import deployment_rows

pytestmark = pytest.mark.django_db

NOTHING = 'id="plan-no-changes">This plan changes nothing: the deployments already match it'


def _api(job: Job) -> APIClient:
    api = APIClient()
    api.force_authenticate(job.created_by)
    return api


def _second_place_job(admin_client: Client) -> Job:
    response = admin_client.post("/jobs/start/", {"kind": "place", "params": '{"time_limit_s": 10}'})
    assert response.status_code == 302
    job = Job.objects.filter(kind="place").order_by("-pk").first()
    assert job is not None
    run_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    return job


def test_a_plan_with_no_moves_says_it_changes_nothing_and_offers_no_apply(
    admin_client: Client,
    viewer_client: Client,
    place_job: Job,  # noqa: F811
) -> None:
    assert _api(place_job).post(f"/api/v1/plans/{place_job.pk}/apply/").json()["applied"] is True
    again = _second_place_job(admin_client)  # planned against the deployments the first one made
    plan = PlacementPlan.objects.get(job=again)
    assert plan.moves == []

    url = f"/jobs/{again.pk}/"
    page = admin_client.get(url).content.decode()
    assert "<li>No changes: the deployments already match.</li>" in page
    assert NOTHING in page and "plan-stale" not in page
    assert 'id="apply-plan"' not in page and f'action="{url}apply/"' not in page
    assert NOTHING in viewer_client.get(url).content.decode()

    before = deployment_rows()
    answer = _api(again).post(f"/api/v1/plans/{again.pk}/apply/")
    assert answer.status_code == 200, answer.content
    assert answer.json()["applied"] is False and answer.json()["moves"] == []
    assert deployment_rows() == before


def test_a_plan_whose_moves_were_made_since_offers_no_apply(
    admin_client: Client,
    place_job: Job,  # noqa: F811
) -> None:
    # A copy of the plan under another place job, computed on the same deployments.
    row = PlacementPlan.objects.get(job=place_job)
    twin_job = Job.objects.create(
        kind="place", status=JobStatus.SUCCEEDED, params=place_job.params, created_by=place_job.created_by
    )
    PlacementPlan.objects.create(
        job=twin_job, plan=row.plan, moves=row.moves, fingerprint=row.fingerprint, model_ids=row.model_ids
    )
    url = f"/jobs/{twin_job.pk}/"
    assert 'id="apply-plan"' in admin_client.get(url).content.decode()

    assert _api(place_job).post(f"/api/v1/plans/{place_job.pk}/apply/").json()["applied"] is True
    page = admin_client.get(url).content.decode()
    assert NOTHING in page and 'id="apply-plan"' not in page and "plan-stale" not in page

    before = deployment_rows()
    response = admin_client.post(f"{url}apply/")  # from a page loaded before
    assert response.status_code == 302
    shown = admin_client.get(response["Location"]).content.decode()
    assert "The deployments already match this plan; nothing changed." in shown
    assert deployment_rows() == before
