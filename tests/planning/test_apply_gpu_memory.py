"""Applying a plan checks again that each model it starts or moves fits the GPUs it goes to (its
share of weights and one request's KV, as the place job sized it) against the model, its profile
and the host's GPUs as they are now. A plan computed before the model's context length, preset or
profile grew, or before its host was registered again with smaller GPUs, put the model on GPUs too
small for it; it is now refused with a 409 naming the model, the GPU, the need and what the GPU
has, and nothing changes."""

from __future__ import annotations

import pytest
from accounts.models import User
from django.test import Client
from inventory.models import Host
from jobs.models import JobStatus
from planning.models import ModelProfile, PlacementPlan
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import (
    GIB,
    deployment_rows,
    make_host,
    make_model,
    result_of,
    run_job_via_api,
    store_profile,
)

# llama-3-8b: 14.96 GiB of weights, 128 KiB of KV per token (0.5 GiB for 4096 tokens): 15.46 GiB
# per GPU, which a 24 GiB GPU holds.
NEEDLES = {
    "context": ("needs 30.96 GiB", "has 24.00 GiB"),  # + 16 GiB of KV for 131072 tokens
    "sim_model": ("needs 27.37 GiB", "has 24.00 GiB"),  # llama-2-13b: 24.24 + 3.13 GiB
    "profile": ("needs 26.96 GiB", "has 24.00 GiB"),  # 3 MiB of KV per token: 12 GiB
    "host": ("needs 15.46 GiB", "has 12.00 GiB"),  # registered again with a 12 GiB GPU
}


def planned_start() -> None:
    make_host("host-l4", gpus=1, gpu_name="NVIDIA L4", memory_gib=24)
    store_profile(make_model("m", sim_model="llama-3-8b"), "producer", 4 * GIB)


def change(admin_client: APIClient, how: str) -> None:
    model = ServedModel.objects.get(name="m")
    if how == "context":
        body: dict[str, object] = {"max_context_length": 131072}
    elif how == "sim_model":
        body = {"engine_options": {"sim_model": "llama-2-13b"}}
    elif how == "profile":  # as a new profile job stores it: a fitted cost model with more KV per token
        profile = ModelProfile.objects.get(model=model)
        profile.data = {**profile.data, "cost_model": {"kv_bytes_per_token": 3 << 20}}
        profile.save(update_fields=["data"])
        return
    else:
        Host.objects.filter(name="host-l4").delete()
        make_host("host-l4", gpus=1, gpu_name="NVIDIA T4", memory_gib=12)
        return
    response = admin_client.patch(f"/api/v1/models/{model.pk}/", body, format="json")
    assert response.status_code == 200, response.data


@pytest.mark.django_db
@pytest.mark.parametrize("how", sorted(NEEDLES))
def test_a_plan_whose_model_no_longer_fits_its_gpu_is_refused_and_changes_nothing(
    admin_client: APIClient, client: Client, alice: User, how: str
) -> None:
    planned_start()
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert [(m["kind"], m["to_server"]) for m in result_of(job)["moves"]] == [("start", "host-l4")]
    change(admin_client, how)

    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 409, response.content
    detail = response.data["detail"]
    need, has = NEEDLES[how]
    assert "model 'm' needs" in detail and "GPU 0 of host 'host-l4'" in detail, detail
    assert need in detail and has in detail and "run a new place job" in detail, detail
    client.force_login(alice)
    page = client.post(f"/jobs/{job.pk}/apply/")
    assert page.status_code == 409 and "GPU 0 of host &#x27;host-l4&#x27;" in page.content.decode()
    assert deployment_rows() == []
    assert PlacementPlan.objects.get(job=job).applied_at is None


@pytest.mark.django_db
def test_a_plan_whose_model_still_fits_after_a_change_applies(admin_client: APIClient) -> None:
    planned_start()
    job = run_job_via_api(admin_client, "place", {})
    model = ServedModel.objects.get(name="m")
    # 32768 tokens: 4 GiB of KV, 18.96 GiB in all, still within the 24 GiB GPU
    response = admin_client.patch(f"/api/v1/models/{model.pk}/", {"max_context_length": 32768}, format="json")
    assert response.status_code == 200, response.data
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200, response.content
    assert response.data["applied"] is True
    assert [(row[1], row[2], row[4]) for row in deployment_rows()] == [("m", "host-l4", [0])]
