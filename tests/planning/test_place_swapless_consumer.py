"""A consumer whose profile needs no swap space at the placed burst level is placed without a
lender (it neither lends nor borrows there), end to end from a simulator profile job; a level that
was not profiled still fails the job, naming the levels that were."""

from __future__ import annotations

from typing import Any

import pytest
from jobs.models import JobStatus
from planning.models import ModelProfile, PlacementPlan
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, make_host, make_model, result_of, run_job_via_api, store_profile

pytestmark = pytest.mark.django_db

# llama-2-13b on an H100 with 700 KV blocks of 16 tokens (800 KiB per token) and at most 16
# sequences: under 27% of the KV is free at its max rate (a consumer), yet even an 8x burst fits.
SWAPLESS: dict[str, Any] = {
    "sim_model": "llama-2-13b",
    "sim_gpu": "h100",
    "kv_cache_bytes": 700 * 16 * 819200,
    "max_num_seqs": 16,
}
WORKLOAD = {"num_requests": 150, "burst_duration_s": 2.0, "seed": 3}


def test_it_places_a_consumer_that_needs_no_swap_at_any_profiled_level(admin_client: APIClient) -> None:
    make_host("host-a")
    make_model("chat13b", **SWAPLESS)
    profiled = run_job_via_api(
        admin_client, "profile", {"model": "chat13b", "workload": WORKLOAD, "initial_rate": 4.0}
    )
    assert profiled.status == JobStatus.SUCCEEDED, profiled.error
    stored = ModelProfile.objects.get(model__name="chat13b")
    assert stored.role == "consumer"
    assert stored.swap_needed_bytes == {"2x": 0, "4x": 0, "8x": 0}

    for level in (2.0, 4.0, 8.0):
        job = run_job_via_api(admin_client, "place", {"burst_level": level, "solver": "greedy"})
        assert job.status == JobStatus.SUCCEEDED, job.error
        plan = result_of(job)["plan"]
        assert [(a["model"], a["server"]) for a in plan["assignments"]] == [("chat13b", "host-a")]
        # nothing to borrow: no lender is spent on it and it does not fall back to host DRAM
        assert plan["pairings"] == [] and plan["dram_fallbacks"] == []
        assert PlacementPlan.objects.filter(job=job).exists()


def test_it_spends_no_lender_or_fallback_on_a_swapless_consumer(
    admin_client: APIClient,
) -> None:
    make_host("host-a")
    make_host("host-b")
    models = {name: make_model(name) for name in ("p10", "c10", "quiet", "c4")}
    store_profile(models["p10"], "producer", 10 * GIB)
    store_profile(models["c10"], "consumer", 10 * GIB)
    store_profile(models["c4"], "consumer", 4 * GIB)
    quiet = store_profile(models["quiet"], "consumer", 4 * GIB)
    quiet.data = {**quiet.data, "swap_needed_bytes": {"2x": 0, "4x": 0, "8x": 0}}
    quiet.save()
    job = run_job_via_api(admin_client, "place", {"time_limit_s": 10})
    assert job.status == JobStatus.SUCCEEDED, job.error
    plan = result_of(job)["plan"]
    servers = {a["model"]: a["server"] for a in plan["assignments"]}
    assert set(servers) == {"p10", "c10", "quiet", "c4"}
    # the producer covers the 10 GiB consumer on its host; the swapless one borrows nothing
    assert [(p["lender"], p["borrower"]) for p in plan["pairings"]] == [("p10", "c10")]
    assert [f["model"] for f in plan["dram_fallbacks"]] == ["c4"]
    assert servers["p10"] == servers["c10"]


def test_it_still_fails_for_a_burst_level_that_was_not_profiled(admin_client: APIClient) -> None:
    make_host("host-a")
    quiet = store_profile(make_model("quiet"), "consumer", 4 * GIB)
    quiet.data = {**quiet.data, "swap_needed_bytes": {"2x": 0, "4x": 0, "8x": 0}}
    quiet.save()
    job = run_job_via_api(admin_client, "place", {"burst_level": 16.0})
    assert job.status == JobStatus.FAILED
    assert "quiet: burst level 16x was not profiled (have 2x, 4x, 8x)" in job.error
    assert not PlacementPlan.objects.filter(job=job).exists()
