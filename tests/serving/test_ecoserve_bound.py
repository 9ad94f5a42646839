"""The GPU-work bound of benchmarks/ecoserve.py (benchmarks/ecoserve_bound.py): what no scheduler
can beat must be a lower bound on the simulator's own busy time, and drop the costliest requests."""

from __future__ import annotations

import pytest

from benchmarks.ecoserve_bound import bound_rate, gpu_load, gpu_seconds
from serving.costmodel import get_preset
from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.workload import Request
from tests.serving.conftest import make_cost


def test_a_requests_work_is_its_prefill_its_decode_steps_and_their_share_of_fixed_costs() -> None:
    cost = make_cost(prefill=(0.010, 1e-4, 1e-6), decode=(0.008, 1e-6, 1e-4))
    r = Request(0, 0.0, 100, 4)  # 3 decode steps over contexts 100, 101, 102
    want = (1e-4 + 1e-6) * 100 + 1e-6 * 303 + (1e-4 + 0.008 / 2) * 3
    assert gpu_seconds(cost, r, max_num_seqs=2) == pytest.approx(want)
    assert gpu_seconds(cost, Request(1, 0.0, 100, 1), max_num_seqs=2) == pytest.approx(0.0101)


def test_the_load_leaves_out_the_costliest_requests_but_no_more_than_the_share_allows() -> None:
    cost = make_cost(prefill=(0.0, 1.0, 0.0), decode=(0.0, 0.0, 0.0))  # one second a prompt token
    reqs = [Request(i, 0.0, p, 1) for i, p in enumerate([1, 2, 3, 4, 100])]
    assert gpu_load(cost, reqs, 10.0, 0.8, 256) == pytest.approx(1.0)  # 100 left out
    assert gpu_load(cost, reqs, 10.0, 0.7, 256) == pytest.approx(1.0)  # 70% of 5 is 3.5: 4 kept
    assert gpu_load(cost, reqs, 10.0, 1.0, 256) == pytest.approx(11.0)


def test_the_bound_rate_is_where_the_load_reaches_one_gpu_second_per_second() -> None:
    assert bound_rate(lambda rate: rate / 7.0, 1.0, 35.0, rel_tol=1e-4) == pytest.approx(7.0, rel=1e-3)
    assert bound_rate(lambda rate: rate / 70.0, 1.0, 35.0) == 35.0
    assert bound_rate(lambda rate: rate, 2.0, 35.0) == 0.0  # not even lo fits


def test_the_simulator_never_serves_a_burst_faster_than_its_work_allows() -> None:
    # All requests arrive at once, so the engine is busy from 0 to its end: that time is GPU time
    # spent, which the bound says is at least their work.
    cost = get_preset("llama-2-13b", "a100")
    reqs = [Request(i, 0.0, 50 + 37 * i, 20 + 13 * (i % 7)) for i in range(40)]
    for policy in ("fcfs", "ecoserve"):
        engine = EngineSim(
            cost,
            EngineConfig(max_num_batched_tokens=512, max_num_seqs=8, num_kv_blocks=4096),
            get_policy(policy),
        )
        engine.run(reqs)
        work = sum(gpu_seconds(cost, r, 8) for r in reqs)
        assert work <= engine.stats.end_time < 2 * work
