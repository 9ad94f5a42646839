"""A plan names its models; a name that belongs to another model by the time it is applied (the
planned one deleted or renamed, another created or renamed to its name) is a 409 and changes
nothing, instead of deploying a model the plan was not computed for."""

from __future__ import annotations

import pytest
from inventory.models import Host
from jobs.models import JobStatus
from planning.models import PlacementPlan
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, deployment_rows, make_model, run_job_via_api, store_profile


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["recreated", "renamed"])
def test_a_plan_whose_model_name_now_names_another_model_is_refused(
    admin_client: APIClient, two_hosts: tuple[Host, Host], how: str
) -> None:
    for name in ("a", "b"):
        store_profile(make_model(name), "producer", 4 * GIB)
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert admin_client.delete(f"/api/v1/models/{ServedModel.objects.get(name='b').pk}/").status_code == 204
    if how == "recreated":
        make_model("b", tp=1)
    else:
        renamed = make_model("never-profiled")
        response = admin_client.patch(f"/api/v1/models/{renamed.pk}/", {"name": "b"}, format="json")
        assert response.status_code == 200, response.data

    before = deployment_rows()
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 409, response.data
    assert "another model named 'b'" in response.data["detail"]
    assert "run a new place job" in response.data["detail"]
    assert deployment_rows() == before == []
    assert PlacementPlan.objects.get(job=job).applied_at is None


@pytest.mark.django_db
def test_a_plan_with_its_own_models_still_applies(
    admin_client: APIClient, two_hosts: tuple[Host, Host]
) -> None:
    for name in ("a", "b"):
        store_profile(make_model(name), "producer", 4 * GIB)
    job = run_job_via_api(admin_client, "place", {})
    ids = dict(ServedModel.objects.values_list("name", "pk"))
    assert PlacementPlan.objects.get(job=job).model_ids == ids
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200 and response.data["applied"], response.data


@pytest.mark.django_db
def test_a_plan_whose_model_was_renamed_names_the_rename(
    admin_client: APIClient, two_hosts: tuple[Host, Host]
) -> None:
    for name in ("a", "b"):
        store_profile(make_model(name), "producer", 4 * GIB)
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    model = ServedModel.objects.get(name="b")
    assert admin_client.patch(f"/api/v1/models/{model.pk}/", {"name": "b2"}, format="json").status_code == 200

    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 409, response.data
    assert "renamed since it was computed: 'b' (now 'b2')" in response.data["detail"]
    assert deployment_rows() == []
    assert PlacementPlan.objects.get(job=job).applied_at is None
