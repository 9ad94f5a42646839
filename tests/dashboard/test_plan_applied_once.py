"""A place job's plan is applied once, from its page or the API: once applied, the page offers no
Apply, and a POST from a page loaded before changes nothing, even after the deployments were changed
back by hand to what the plan was computed on (when the plan would no longer be refused as stale)."""

from __future__ import annotations

import pytest
from deployments.models import Deployment, DesiredState
from django.test import Client
from inventory.models import Device
from jobs.models import Job
from planning.models import PlacementPlan
from planning.placing import fingerprint

from tests.dashboard.test_dashboard_results import place_job  # noqa: F401  (the fixture)
from tests.planning.helpers import deployment_rows

pytestmark = pytest.mark.django_db


def change_back(rows: list[tuple[int, str, str, str, list[int]]]) -> None:
    """What an operator's edits can do: every deployment of ``rows`` as it was, any newer one stopped."""
    was = {pk: (desired, indices) for pk, _model, _host, desired, indices in rows}
    for d in Deployment.objects.select_related("host"):
        desired, indices = was.get(d.pk, (DesiredState.STOPPED, [x.index for x in d.devices.all()]))
        Deployment.objects.filter(pk=d.pk).update(desired_state=desired)
        d.devices.set(Device.objects.filter(host=d.host, index__in=indices))


def test_it_offers_no_apply_once_the_plan_is_applied_and_a_stale_apply_changes_nothing(
    admin_client: Client,
    place_job: Job,  # noqa: F811
) -> None:
    url = f"/jobs/{place_job.pk}/"
    before = deployment_rows()
    assert 'id="apply-plan"' in admin_client.get(url).content.decode()
    assert admin_client.post(f"{url}apply/").status_code == 302
    plan = PlacementPlan.objects.get(job=place_job)
    assert plan.applied_at is not None
    page = admin_client.get(url).content.decode()
    assert 'id="apply-plan"' not in page and f'action="{url}apply/"' not in page
    assert "<p>Applied " in page and " by alice.</p>" in page

    change_back(before)
    assert fingerprint() == plan.fingerprint  # the plan would pass for fresh again
    reverted = deployment_rows()
    response = admin_client.post(f"{url}apply/")  # the Apply of a page loaded before the first
    assert response.status_code == 302 and response["Location"] == url
    notice = admin_client.get(url).content.decode()
    assert 'id="notice">This plan was already applied by alice; nothing changed.' in notice
    assert deployment_rows() == reverted
    applied_at = plan.applied_at
    plan.refresh_from_db()
    assert plan.applied_at == applied_at


def test_the_api_applies_a_plan_once_too(
    admin_client: Client,
    place_job: Job,  # noqa: F811
) -> None:
    before = deployment_rows()
    url = f"/api/v1/plans/{place_job.pk}/apply/"
    first = admin_client.post(url)
    assert first.status_code == 200 and first.json()["applied"] is True, first.content
    plan = PlacementPlan.objects.get(job=place_job)

    change_back(before)
    assert fingerprint() == plan.fingerprint
    reverted = deployment_rows()
    again = admin_client.post(url)
    assert again.status_code == 200, again.content
    assert again.json()["applied"] is False and again.json()["moves"] == []
    assert again.json()["detail"].startswith("This plan was already applied by alice; nothing changed.")
    assert deployment_rows() == reverted
