"""A plan the API would refuse to apply (stale: the deployments changed since it was computed, a host
it starts a model on went offline, a model of it was renamed) is shown without Apply, with the API's
reason; an Apply posted from a page loaded before is still refused with that reason, changing
nothing. A plan the API would apply offers Apply and no such note."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from deployments.models import Deployment, DesiredState
from django.test import Client
from inventory.models import Host, HostStatus
from jobs.models import Job, JobStatus
from planning.models import PlacementPlan
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.dashboard.test_dashboard_results import place_job  # noqa: F401  (the fixture)
from tests.planning.helpers import deployment_rows

pytestmark = pytest.mark.django_db

STALE = r'id="plan-stale">This plan can no longer be applied: '


def _deployment_stopped() -> None:
    Deployment.objects.filter(model__name="p6").update(desired_state=DesiredState.STOPPED)


def _hosts_offline() -> None:
    Host.objects.update(status=HostStatus.OFFLINE)


def _model_renamed() -> None:
    ServedModel.objects.filter(name="c10").update(name="c10-renamed")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_deployment_stopped, "The deployments changed since this plan was computed"),
        (_hosts_offline, "The plan starts models on offline host(s)"),
        (_model_renamed, "Models of the plan were renamed since it was computed: 'c10'"),
    ],
    ids=["deployments-changed", "host-offline", "model-renamed"],
)
def test_a_stale_plan_offers_no_apply_and_says_why(
    admin_client: Client,
    viewer_client: Client,
    place_job: Job,  # noqa: F811
    change: Callable[[], None],
    reason: str,
) -> None:
    url = f"/jobs/{place_job.pk}/"
    fresh = admin_client.get(url).content.decode()
    assert 'id="apply-plan"' in fresh and "plan-stale" not in fresh

    change()
    before = deployment_rows()
    api = APIClient()
    api.force_authenticate(place_job.created_by)
    # What the API answers an Apply with now, under its locks (it changes nothing either).
    refused = api.post(f"/api/v1/plans/{place_job.pk}/apply/")
    assert refused.status_code == 409 and refused.json()["detail"].startswith(reason), refused.content
    detail = refused.json()["detail"]

    page = admin_client.get(url).content.decode()
    assert 'id="apply-plan"' not in page and f'action="{url}apply/"' not in page
    assert f"{STALE}{detail}</p>" in page.replace("&#x27;", "'")
    assert f"{STALE}{detail}</p>" in viewer_client.get(url).content.decode().replace("&#x27;", "'")

    response = admin_client.post(f"{url}apply/")  # from a page loaded before the change
    assert response.status_code == 409
    shown = response.content.decode().replace("&#x27;", "'")
    assert f'id="refusal">Not applied: {detail}</p>' in shown and "plan-stale" not in shown
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=place_job).applied_at is None


def test_a_plan_stored_in_an_unreadable_shape_offers_no_apply_and_the_api_says_why(
    admin_client: Client,
    place_job: Job,  # noqa: F811
) -> None:
    row = PlacementPlan.objects.get(job=place_job)
    for server in row.plan["servers"]:
        del server["gpu_memory_bytes"]  # as a plan stored before that field was added
    row.save(update_fields=["plan"])
    before = deployment_rows()

    page = admin_client.get(f"/jobs/{place_job.pk}/")
    assert page.status_code == 200
    text = page.content.decode().replace("&#x27;", "'")
    assert 'id="apply-plan"' not in text and f"{STALE}The stored plan cannot be read" in text

    api = APIClient()
    api.force_authenticate(place_job.created_by)
    refused = api.post(f"/api/v1/plans/{place_job.pk}/apply/")
    assert refused.status_code == 404 and "stored plan cannot be read" in refused.json()["detail"]
    assert deployment_rows() == before


@pytest.mark.parametrize("status", [JobStatus.CANCELLED, JobStatus.FAILED])
def test_a_plan_whose_job_did_not_succeed_offers_no_apply_and_the_api_says_why(
    admin_client: Client,
    place_job: Job,  # noqa: F811
    status: JobStatus,
) -> None:
    # Its plan was stored, then the job was cancelled (or its worker killed, and the job failed as
    # lost) before it was marked succeeded.
    Job.objects.filter(pk=place_job.pk).update(status=status)
    before = deployment_rows()

    text = admin_client.get(f"/jobs/{place_job.pk}/").content.decode()
    assert 'id="apply-plan"' not in text
    assert f"{STALE}Job {place_job.pk} is a {status} place job, not a succeeded place job" in text

    api = APIClient()
    api.force_authenticate(place_job.created_by)
    refused = api.post(f"/api/v1/plans/{place_job.pk}/apply/")
    assert refused.status_code == 404 and f"is a {status} place job" in refused.json()["detail"]
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=place_job).applied_at is None
