"""A consumer that needs no swap space at the burst level it is placed for is a neutral model: every
placer gives it GPUs, but it moves neither balance, changes no weight, and gets no lender or DRAM
fallback; a profile with such a level converts to it instead of failing."""

from __future__ import annotations

import json

import pytest

from serving.costmodel import get_preset
from serving.placement import (
    ModelProfile,
    PlacementError,
    PlacementInstance,
    PlacerConfig,
    ServerSpec,
    available_placers,
    get_placer,
)
from serving.profiler import LatencySLA, ProfilerConfig, WorkloadSpec, model_profile_from_dict, profile_model
from serving.profiler.sim_probe import SimulatorProbe
from serving.sim.config import EngineConfig

GIB = 1 << 30


def servers(n: int = 2, gpus: int = 2) -> list[ServerSpec]:
    return [ServerSpec(f"srv{i}", gpus, 80 * GIB) for i in range(n)]


def models_with_neutrals() -> list[ModelProfile]:
    return [
        ModelProfile("p10", "producer", 1, lendable_bytes=10 * GIB),
        ModelProfile("c10", "consumer", 1, needed_bytes=10 * GIB),
        ModelProfile("n1", "neutral", 1),
        ModelProfile("n2", "neutral", 1),
    ]


@pytest.mark.parametrize("solver", available_placers())
def test_it_places_neutral_models_without_moving_either_balance(solver: str) -> None:
    plan = get_placer(solver, PlacerConfig(time_limit_s=5, num_workers=1)).place(
        models_with_neutrals(), servers()
    )
    assert set(plan.assignments) == {"p10", "c10", "n1", "n2"}
    # counted as consumers, the neutrals would force a role imbalance on some server: objective > 0
    assert plan.objective == 0 and plan.status == "optimal"
    assert [(p.lender, p.borrower) for p in plan.pairings] == [("p10", "c10")]
    assert plan.dram_fallbacks == ()
    assert all(s.role_balance == 0 and s.memory_balance_bytes == 0 for s in plan.server_summaries)
    assert plan.assignments["p10"].server == plan.assignments["c10"].server


def test_its_neutral_models_leave_the_role_weight_and_bounds_unchanged() -> None:
    config = PlacerConfig()
    without = PlacementInstance.build(models_with_neutrals()[:2], servers(), config)
    with_them = PlacementInstance.build(models_with_neutrals(), servers(), config)
    assert with_them.role_weight == without.role_weight
    assert with_them.lower_bound() == without.lower_bound() == 0
    only_neutral = PlacementInstance.build([ModelProfile("n", "neutral", 2)], servers(1), config)
    assert only_neutral.role_weight == 1 and only_neutral.objective([0]) == 0


def test_it_rejects_a_neutral_model_that_lends_or_needs_bytes() -> None:
    with pytest.raises(PlacementError, match="neutral model lends and needs nothing"):
        ModelProfile("n", "neutral", 1, needed_bytes=GIB)
    with pytest.raises(PlacementError, match="neutral model lends and needs nothing"):
        ModelProfile("n", "neutral", 1, lendable_bytes=GIB)
    with pytest.raises(PlacementError, match="'producer', 'consumer' or 'neutral'"):
        ModelProfile("n", "idle", 1)  # type: ignore[arg-type]


def test_a_stored_consumer_converts_per_level_to_neutral_or_consumer() -> None:
    stored = {"model": "c", "role": "consumer", "max_rps": 3.0, "swap_needed_bytes": {"2x": 0, "4x": 7}}
    assert model_profile_from_dict(stored, tp=2, burst_level=2.0) == ModelProfile(
        "c", "neutral", 2, max_rps=3.0
    )
    assert model_profile_from_dict(stored, burst_level=4.0) == ModelProfile(
        "c", "consumer", 1, needed_bytes=7, max_rps=3.0
    )
    with pytest.raises(PlacementError, match="needed_bytes"):
        model_profile_from_dict({**stored, "swap_needed_bytes": {"4x": -1}})


def test_a_simulated_consumer_whose_bursts_fit_is_placed_at_every_profiled_level() -> None:
    # llama-2-13b with 700 blocks of 16 tokens and 16 sequences at most: under 30% of its KV is
    # free at the max rate (a consumer), but even an 8x burst fits in its own cache
    workload = WorkloadSpec(num_requests=150, burst_duration_s=2.0, seed=3, max_context=4096)
    probe = SimulatorProbe(
        get_preset("llama-2-13b", "h100"),
        EngineConfig(num_kv_blocks=700, block_size=16, max_num_seqs=16),
        workload,
    )
    profile = profile_model(
        "chat13b", probe, LatencySLA(0.2, 0.05), workload, ProfilerConfig(initial_rate=4.0)
    )
    assert profile.role == "consumer" and profile.swap_needed_bytes == {2.0: 0, 4.0: 0, 8.0: 0}
    stored = json.loads(json.dumps(profile.to_dict()))
    for level in (2.0, 4.0, 8.0):
        placed = model_profile_from_dict(stored, burst_level=level)
        assert placed == ModelProfile("chat13b", "neutral", 1, max_rps=profile.max_rps)
        plan = get_placer("greedy").place([placed], servers(1, 1))
        assert plan.assignments["chat13b"].gpus == (0,) and not plan.pairings and not plan.dram_fallbacks
