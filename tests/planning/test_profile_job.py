"""The profile job on the simulator: curve and model profile stored, max rate within 5% of a fine
sweep, bad input fails with a clear error and stores nothing, cancellation stops a running job."""

from __future__ import annotations

import math
import threading
import time

import pytest
from jobs.kinds.profile import ProfileParams
from jobs.models import Job, JobStatus
from jobs.services import cancel_job
from jobs.tasks import run_job
from planning.models import ModelProfile
from planning.profiling import simulator_probe, workload_of
from rest_framework.test import APIClient

from serving.profiler import LatencySLA
from tests.planning.helpers import deployment_rows, make_model, result_of, run_job_via_api

WORKLOAD = {"num_requests": 150, "burst_duration_s": 2.0, "seed": 3}
PARAMS = {"model": "llama-3-8b", "preset_gpu": "h100", "workload": WORKLOAD, "initial_rate": 4.0}


@pytest.mark.django_db
def test_it_stores_the_curve_and_the_profile_with_the_max_rate_within_5_percent_of_a_sweep(
    admin_client: APIClient,
) -> None:
    model = make_model("llama-3-8b", ttft_ms=200.0, tbt_ms=50.0)
    job = run_job_via_api(admin_client, "profile", PARAMS)
    assert job.status == JobStatus.SUCCEEDED, job.error
    result = result_of(job)
    assert result["backend"] == "simulator" and result["sla"] == {"ttft_p99_s": 0.2, "tbt_p99_s": 0.05}
    curve = result["curve"]
    rates = [p["rate"] for p in curve]
    assert len(curve) >= 5 and rates == sorted(rates) and result["max_rps"] in rates
    # every point at or below the max rate meets the SLO, and the next probed rate misses it
    sla = LatencySLA(0.2, 0.05)
    for p in curve:
        meets = (
            p["ttft_p99_s"] is not None
            and p["ttft_p99_s"] <= sla.ttft_p99_s
            and p["tbt_p99_s"] <= sla.tbt_p99_s
        )
        assert meets == (p["rate"] <= result["max_rps"]), p

    # a fine sweep with the same probe the job used: 1.5% steps around the answer
    probe = simulator_probe(model, PARAMS, workload_of(model, PARAMS))
    grid = [result["max_rps"] * 0.7 * 1.015**k for k in range(int(math.log(1.3 / 0.7) / math.log(1.015)) + 1)]
    meets = [probe.measure(r).meets(sla) for r in grid]
    assert meets[0] and not meets[-1]
    sweep_max = grid[meets.index(False) - 1]
    assert abs(result["max_rps"] - sweep_max) / sweep_max <= 0.05

    stored = ModelProfile.objects.get(model=model)
    assert stored.job_id == job.pk and stored.backend == "simulator"
    assert (stored.max_rps, stored.role, stored.lendable_bytes) == (
        result["max_rps"],
        result["role"],
        result["lendable_bytes"],
    )
    assert stored.role == "producer" and stored.lendable_bytes > 0
    assert stored.data["curve"] == curve and (stored.slo_ttft_p99_ms, stored.slo_tbt_p99_ms) == (200.0, 50.0)


@pytest.mark.django_db
def test_it_sizes_a_consumers_swap_per_burst_level(admin_client: APIClient) -> None:
    # 1200 blocks of 16 tokens: too little KV for the max rate's bursts (as in tests/serving)
    kv_bytes = 1200 * 16 * 131072  # llama-3-8b: 128 KiB of KV per token
    model = make_model("llama-3-8b", ttft_ms=100.0, tbt_ms=30.0, kv_cache_bytes=kv_bytes)
    job = run_job_via_api(admin_client, "profile", PARAMS)
    assert job.status == JobStatus.SUCCEEDED, job.error
    stored = ModelProfile.objects.get(model=model)
    assert stored.role == "consumer" and stored.lendable_bytes == 0
    assert stored.kv_capacity_bytes == kv_bytes
    needs = stored.swap_needed_bytes
    assert list(needs) == ["2x", "4x", "8x"] and 0 < needs["2x"] <= needs["4x"] <= needs["8x"]


@pytest.mark.django_db
def test_it_fails_bad_input_with_a_clear_error_and_stores_nothing(admin_client: APIClient) -> None:
    make_model("llama-3-8b", ttft_ms=0.05, tbt_ms=0.001)  # an SLO no rate can meet
    before = deployment_rows()
    job = run_job_via_api(admin_client, "profile", {**PARAMS, "min_rate": 0.5})
    assert job.status == JobStatus.FAILED
    assert "is missed even at" in job.error
    assert job.result is None and not ModelProfile.objects.exists()
    assert deployment_rows() == before


@pytest.mark.django_db
def test_it_rejects_bad_parameters_before_running(admin_client: APIClient) -> None:
    make_model("llama-3-8b")
    bad = [
        {"model": "nope"},
        {"model": "llama-3-8b", "backend": "gpu"},
        {"model": "llama-3-8b", "workload": {"dataset": "nope"}},
        {"model": "llama-3-8b", "workload": {"num_requests": 0}},
        {"model": "llama-3-8b", "min_rate": 5.0, "initial_rate": 1.0},
        {"model": "llama-3-8b", "deployment": 1},
        {"model": "llama-3-8b", "rates": [1, 2]},
    ]
    for params in bad:
        response = admin_client.post("/api/v1/jobs/", {"kind": "profile", "params": params}, format="json")
        assert response.status_code == 400, params
        assert "params" in response.data
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_stops_a_running_profile_job_when_cancelled() -> None:
    model = make_model("llama-3-8b")
    slow = ProfileParams(data={**PARAMS, "workload": {**WORKLOAD, "num_requests": 1000}, "rel_tol": 0.001})
    assert slow.is_valid(), slow.errors
    # a queued row, as the API stores it (no broker here: the task function runs in a thread)
    job = Job.objects.create(kind="profile", params=dict(slow.validated_data))
    worker = threading.Thread(target=run_job, args=(job.pk,))
    worker.start()
    deadline = time.monotonic() + 120
    while Job.objects.get(pk=job.pk).progress == 0.0:
        assert time.monotonic() < deadline, "the job never reported progress"
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    cancel_job(Job.objects.get(pk=job.pk))
    worker.join(timeout=120)
    assert not worker.is_alive()
    stopped_after = time.monotonic() - cancelled_at
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.result is None
    assert not ModelProfile.objects.filter(model=model).exists()
    assert stopped_after < 30, f"the job took {stopped_after:.1f} s to stop"
