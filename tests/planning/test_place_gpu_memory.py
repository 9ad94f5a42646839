"""A place job only puts a model on GPUs that can load it: its weights (of its cost-model preset)
and one request's KV per GPU. The placer saw no model memory at all, so a model landed on GPUs far
too small for its weights whenever the balance put it there."""

from __future__ import annotations

import pytest
from jobs.models import JobStatus
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, make_host, make_model, result_of, run_job_via_api, store_profile


@pytest.mark.django_db
def test_a_model_is_placed_on_the_host_whose_gpus_hold_its_weights(admin_client: APIClient) -> None:
    # llama-3-8b: 14.96 GiB of weights and 0.5 GiB of KV for 4096 tokens; "a-small" is first in
    # name order, where it went (on equal balance) before.
    make_host("a-small", gpus=1, gpu_name="NVIDIA T4", memory_gib=12)
    make_host("b-h100", gpus=1)
    store_profile(make_model("m", sim_model="llama-3-8b"), "producer", 4 * GIB)

    job = run_job_via_api(admin_client, "place", {"solver": "greedy"})
    assert job.status == JobStatus.SUCCEEDED, job.error
    plan = result_of(job)["plan"]
    assert [(a["model"], a["server"]) for a in plan["assignments"]] == [("m", "b-h100")]


@pytest.mark.django_db
def test_a_model_no_host_can_load_fails_the_job_naming_it(admin_client: APIClient) -> None:
    make_host("a-small", gpus=2, gpu_name="NVIDIA T4", memory_gib=12)
    make_host("b-h100", gpus=1)
    store_profile(make_model("llama-3-70b"), "producer", 4 * GIB)  # 131 GiB of weights on one GPU
    store_profile(make_model("m"), "consumer", 4 * GIB)

    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(
        "PlacementError: models that fit no server's GPU memory: llama-3-70b needs 132."
    )
    assert "has 80.00 GiB" in job.error
