"""An apply that finds the deployments already matching its plan changed nothing, so it does not
mark the plan applied: asked again it still says "already match", never "already applied by" a user
who applied nothing; once it does change the deployments, it is applied once as before."""

from __future__ import annotations

import pytest
from deployments.models import Deployment, DesiredState
from jobs.models import Job, JobStatus
from planning.models import PlacementPlan
from planning.placing import fingerprint
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, deployment_rows, make_host, make_model, run_job_via_api, store_profile

pytestmark = pytest.mark.django_db

MATCH = "The deployments already match this plan; nothing changed."


def _twin(job: Job) -> Job:
    """Another place job with the same plan, computed on the same deployments."""
    row = PlacementPlan.objects.get(job=job)
    twin = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, params=job.params)
    PlacementPlan.objects.create(
        job=twin, plan=row.plan, moves=row.moves, fingerprint=row.fingerprint, model_ids=row.model_ids
    )
    return twin


def test_a_plan_whose_changes_were_in_place_is_not_reported_as_applied(admin_client: APIClient) -> None:
    make_host("solo")
    store_profile(make_model("p"), "producer", 4 * GIB)
    job = run_job_via_api(admin_client, "place", {})
    twin = _twin(job)
    computed_on = PlacementPlan.objects.get(job=job).fingerprint
    assert admin_client.post(f"/api/v1/plans/{job.pk}/apply/").data["applied"] is True  # starts p

    after = deployment_rows()
    for _ in range(2):  # it said "already applied by admin" the second time
        answer = admin_client.post(f"/api/v1/plans/{twin.pk}/apply/")
        assert answer.status_code == 200, answer.data
        assert answer.data == {"applied": False, "moves": [], "detail": MATCH}
        assert deployment_rows() == after
    row = PlacementPlan.objects.get(job=twin)
    assert row.applied_at is None and row.applied_by is None
    assert admin_client.get(f"/api/v1/plans/{twin.pk}/").data["applied_at"] is None

    # p stopped by hand: the deployments are what the twin was computed on, and it was never applied
    Deployment.objects.update(desired_state=DesiredState.STOPPED)
    assert fingerprint() == computed_on
    applied = admin_client.post(f"/api/v1/plans/{twin.pk}/apply/")
    assert applied.data["applied"] is True and [m["kind"] for m in applied.data["moves"]] == ["start"]
    again = admin_client.post(f"/api/v1/plans/{twin.pk}/apply/")
    assert again.data["applied"] is False and again.data["detail"].startswith(
        "This plan was already applied by"
    )
