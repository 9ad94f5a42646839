"""A profiled model renamed since its profile job is still placed, under its new name: the profile
is the model's (by row), and the name kept in its data is the one it had when profiled."""

from __future__ import annotations

import pytest
from inventory.models import Host
from jobs.models import JobStatus
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, make_model, result_of, run_job_via_api, store_profile


@pytest.mark.django_db
def test_a_renamed_model_is_placed_under_its_new_name(
    admin_client: APIClient, two_hosts: tuple[Host, Host]
) -> None:
    model = make_model("before")
    store_profile(model, "producer", 6 * GIB)
    store_profile(make_model("other"), "consumer", 4 * GIB)
    response = admin_client.patch(f"/api/v1/models/{model.pk}/", {"name": "after"}, format="json")
    assert response.status_code == 200, response.data
    assert admin_client.get("/api/v1/profiles/after/").status_code == 200

    for params in ({"models": ["after"]}, {}):
        job = run_job_via_api(admin_client, "place", params)
        assert job.status == JobStatus.SUCCEEDED, job.error
        assert "after" in {a["model"] for a in result_of(job)["plan"]["assignments"]}

    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200, response.data
    assert {m["model"] for m in response.data["moves"]} == {"after", "other"}
