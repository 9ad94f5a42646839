"""A profile is measured at the model's tensor-parallel size (the simulator's cost model and KV
capacity, or the engine's devices, depend on it): after the size changes, a place job refuses the
old profile, as it refuses one measured against another SLO, instead of placing the model on the
new number of GPUs with figures measured on the old one."""

from __future__ import annotations

import pytest
from inventory.models import Host
from jobs.models import JobStatus
from planning.models import ModelProfile
from rest_framework.test import APIClient

from tests.planning.helpers import make_model, run_job_via_api

PROFILE = {
    "model": "m",
    "preset_model": "llama-3-8b",
    "preset_gpu": "h100",
    "workload": {"num_requests": 50, "burst_duration_s": 1.0},
    "rel_tol": 0.3,
    "burst_levels": [2, 4],
}


@pytest.mark.django_db
def test_a_profile_measured_at_another_tp_size_is_refused(
    admin_client: APIClient, two_hosts: tuple[Host, Host]
) -> None:
    model = make_model("m", tp=1)
    job = run_job_via_api(admin_client, "profile", PROFILE)
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert ModelProfile.objects.get(model=model).tensor_parallel_size == 1
    # shown with the SLO it was measured against: what a place job checks it against
    assert admin_client.get("/api/v1/profiles/m/").data["tensor_parallel_size"] == 1
    response = admin_client.patch(f"/api/v1/models/{model.pk}/", {"tensor_parallel_size": 2}, format="json")
    assert response.status_code == 200, response.data

    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "PlacementError: the profile of m was measured at tensor-parallel size 1, but its size is now 2; "
        "profile it again"
    )

    job = run_job_via_api(admin_client, "profile", PROFILE)  # profiled again, at size 2
    assert job.status == JobStatus.SUCCEEDED, job.error
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
