"""The Aqua profiler: rate search on the simulator, roles, burst sizing, fitting, errors."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from serving.costmodel import CostModel, PhaseCoeffs, get_preset, kv_capacity_tokens
from serving.placement import ModelProfile
from serving.profiler import (
    BurstResult,
    LatencySLA,
    ProbeResult,
    ProfilerConfig,
    ProfilingCancelled,
    ProfilingError,
    RateProbe,
    SimulatorProbe,
    WorkloadSpec,
    model_profile_from_dict,
    profile_model,
)
from serving.profiler.sim_probe import tail_percentile
from serving.sim.config import EngineConfig
from serving.workload.request import Request

COST = get_preset("llama-3-8b", "h100")
FULL_BLOCKS = kv_capacity_tokens("llama-3-8b", "h100") // 16
SLA = LatencySLA(ttft_p99_s=0.2, tbt_p99_s=0.05)
WORKLOAD = WorkloadSpec(num_requests=150, burst_duration_s=2.0, seed=3)


def make_probe(num_kv_blocks: int = FULL_BLOCKS) -> SimulatorProbe:
    return SimulatorProbe(COST, EngineConfig(num_kv_blocks=num_kv_blocks), WORKLOAD)


class CountingProbe(RateProbe):
    """Unit-test stand-in: meets the SLA exactly up to `threshold` req/s; optional samples."""

    def __init__(self, threshold: float, samples_from: CostModel | None = None, free: int = 0) -> None:
        self.threshold = threshold
        self.samples_from = samples_from
        self.free = free
        self.rates: list[float] = []
        self.rng = random.Random(0)

    @property
    def kv_bytes_per_token(self) -> int:
        return 1024

    def measure(self, rate: float) -> ProbeResult:
        self.rates.append(rate)
        ttft = 0.1 if rate <= self.threshold else 1.0
        prefill, decode = (), ()
        if self.samples_from is not None:
            prefill, decode = self._samples(self.samples_from)
        return ProbeResult(rate, ttft, 0.01, ttft, 0.01, 100, 100, 1000, 1000 - self.free, prefill, decode)

    def measure_burst(self, rate: float, factor: float) -> BurstResult:
        return BurstResult(rate, factor, int(1000 + 100 * factor), 1000)

    def _samples(self, cost: CostModel) -> tuple[tuple, tuple]:
        noise = lambda: 1 + self.rng.uniform(-0.01, 0.01)  # noqa: E731
        prefill = []
        decode = []
        for _ in range(20):
            chunks = tuple(self.rng.randint(16, 2048) for _ in range(self.rng.randint(1, 4)))
            prefill.append((chunks, cost.prefill_time(chunks) * noise()))
            ctx = tuple(self.rng.randint(100, 4000) for _ in range(self.rng.randint(1, 64)))
            decode.append((ctx, cost.decode_time(ctx) * noise()))
        return tuple(prefill), tuple(decode)


def test_it_finds_the_max_rate_within_5_percent_of_a_fine_sweep() -> None:
    profile = profile_model("llama-3-8b", make_probe(), SLA, WORKLOAD, ProfilerConfig(initial_rate=4.0))
    # sweep a 1.5%-step grid around the answer with a fresh probe; the sweep's max rate is the
    # last grid rate before the first one that misses the SLA
    sweep_probe = make_probe()
    grid = [profile.max_rps * 0.7 * 1.015**k for k in range(int(math.log(1.3 / 0.7) / math.log(1.015)) + 1)]
    meets = [sweep_probe.measure(r).meets(SLA) for r in grid]
    assert meets[0] and not meets[-1], "the grid must straddle the max rate"
    sweep_max = grid[meets.index(False) - 1]
    assert abs(profile.max_rps - sweep_max) / sweep_max <= 0.05
    # the curve holds every probed point, in rate order, and the max rate is one of them
    rates = [p.rate for p in profile.curve]
    assert rates == sorted(set(rates)) and profile.max_rps in rates
    assert all(p.meets(SLA) for p in profile.curve if p.rate <= profile.max_rps)


def test_it_classifies_a_roomy_engine_as_producer_with_lendable_memory() -> None:
    profile = profile_model("roomy", make_probe(), SLA, WORKLOAD, ProfilerConfig(initial_rate=4.0))
    at_max = next(p for p in profile.curve if p.rate == profile.max_rps)
    assert profile.role == "producer"
    assert 0 < at_max.peak_kv_used_bytes < at_max.kv_capacity_bytes
    assert profile.free_kv_bytes == at_max.kv_capacity_bytes - at_max.peak_kv_used_bytes
    assert profile.lendable_bytes == profile.free_kv_bytes - int(0.1 * at_max.kv_capacity_bytes)
    assert profile.bursts == () and profile.cost_model is None
    assert profile.to_model_profile(tp=2) == ModelProfile(
        "roomy", "producer", 2, lendable_bytes=profile.lendable_bytes, max_rps=profile.max_rps
    )


def test_it_classifies_a_tight_engine_as_consumer_and_sizes_swap_per_burst_level() -> None:
    sla = LatencySLA(ttft_p99_s=0.1, tbt_p99_s=0.03)  # a lower max rate keeps the bursts small
    profile = profile_model("tight", make_probe(1200), sla, WORKLOAD, ProfilerConfig(initial_rate=4.0))
    assert profile.role == "consumer" and profile.lendable_bytes == 0
    needs = profile.swap_needed_bytes
    assert list(needs) == [2.0, 4.0, 8.0]
    assert 0 < needs[2.0] <= needs[4.0] <= needs[8.0]
    for burst in profile.bursts:
        assert burst.rate == profile.max_rps
        assert burst.swap_needed_bytes == burst.peak_kv_demand_bytes - profile.kv_capacity_bytes
    placed = profile.to_model_profile(tp=1, burst_level=4.0)
    assert placed == ModelProfile("tight", "consumer", 1, needed_bytes=needs[4.0], max_rps=profile.max_rps)
    stored = json.loads(json.dumps(profile.to_dict()))
    assert model_profile_from_dict(stored, tp=2, burst_level=8.0).needed_bytes == needs[8.0]
    with pytest.raises(ProfilingError, match="3x was not profiled"):
        model_profile_from_dict(stored, burst_level=3.0)


@pytest.mark.parametrize("levels", [(4.0, 4.0000001), (2.0, 2.0)])
def test_burst_levels_named_alike_are_refused(levels: tuple[float, float]) -> None:
    # to_dict keys swap needs by f"{factor:g}x": 4.0 and 4.0000001 were both "4x", so the stored
    # profile kept one level's figure and placement read it for the other.
    with pytest.raises(ValueError, match=r"burst levels .* are both '.x': give distinct levels"):
        ProfilerConfig(burst_levels=levels)
    profile = profile_model("tight", CountingProbe(threshold=5.0), SLA, WORKLOAD, ProfilerConfig())
    assert profile.role == "consumer"
    bursts = tuple(BurstResult(profile.max_rps, f, int(1000 + 100 * f), 1000) for f in levels)
    with pytest.raises(ValueError, match=r"burst levels .* are both '.x'"):
        dataclasses.replace(profile, bursts=bursts)


def test_peak_kv_use_is_the_same_with_and_without_fast_forward() -> None:
    # Regression: a fast-forwarded decode run wrote the cache's free count once, after the
    # finishing requests had returned their blocks, so the peak just before those finishes went
    # unseen: the burst probe under-sized a consumer's swap space and the rate probe over-stated
    # free (lendable) memory, by the blocks the run's decodes had allocated.
    reqs = [Request(i, 0.0, 16, 40 + i) for i in range(8)]
    peaks = []
    for fast_forward in (True, False):
        config = EngineConfig(num_kv_blocks=1000, block_size=4, fast_forward=fast_forward)
        probe = SimulatorProbe(COST, config, WORKLOAD)
        peaks.append(probe._run(config, reqs)[1])
    # The peak is just before the first finishes: 8 sequences of 16 + 40 - 1 tokens, 14 blocks each.
    assert peaks[0] == peaks[1] == 8 * 14 * 4 * COST.kv_bytes_per_token


def test_it_rejects_a_bad_sla() -> None:
    for ttft, tbt in [(0, 0.05), (-1.0, 0.05), (0.2, 0.0), (math.nan, 0.05), (0.2, math.inf)]:
        with pytest.raises(ValueError, match="must be a positive finite number"):
            LatencySLA(ttft, tbt)


def test_it_rejects_a_bad_workload_or_config_up_front() -> None:
    with pytest.raises(ValueError, match="nosuchdata"):
        WorkloadSpec(dataset="nosuchdata")
    with pytest.raises(ValueError, match="num_requests"):
        WorkloadSpec(num_requests=0)
    with pytest.raises(ValueError, match="burstiness=1e-12"):  # hung the first probe's arrivals
        WorkloadSpec(kind="gamma", burstiness=1e-12)
    # These were accepted and failed only at the first probe, a NaN num_requests naming a
    # duration_s nobody gave.
    for kw, name in [
        ({"num_requests": math.nan}, "num_requests"),
        ({"num_requests": 2.5}, "num_requests"),
        ({"seed": -1}, "seed"),
        ({"max_context": 1}, "max_context"),
        ({"max_context": math.inf}, "max_context"),
    ]:
        with pytest.raises(ValueError, match=rf"self\.{name}="):
            WorkloadSpec(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="initial_rate"):
        ProfilerConfig(initial_rate=0.0)
    with pytest.raises(ValueError, match="safety_margin"):
        ProfilerConfig(producer_threshold=0.1, safety_margin=0.2)


def test_it_reports_an_sla_missed_even_at_the_lowest_rate() -> None:
    probe = CountingProbe(threshold=0.0)
    with pytest.raises(ProfilingError, match=r"missed even at 0\.01 req/s"):
        profile_model("m", probe, SLA, WORKLOAD, ProfilerConfig(initial_rate=1.0, min_rate=0.01))
    assert min(probe.rates) == 0.01


def test_a_workload_that_draws_no_requests_is_an_error_not_a_missed_sla() -> None:
    # Poisson arrivals for about 2 requests: seed 0 draws none at any rate (same requests per
    # rate, times scaled). No latency was measured, so "the SLA is missed" would be wrong.
    tiny = WorkloadSpec(num_requests=2, seed=0)
    probe = SimulatorProbe(COST, EngineConfig(num_kv_blocks=FULL_BLOCKS), tiny)
    with pytest.raises(ProfilingError, match="no requests") as err:
        profile_model("m", probe, SLA, tiny, ProfilerConfig(max_probes=8))
    assert "num_requests=2" in str(err.value) and "missed" not in str(err.value)


def test_it_bisects_to_the_threshold_with_few_probes_and_reports_progress_to_one() -> None:
    probe = CountingProbe(threshold=37.3)
    seen: list[float] = []
    profile = profile_model(
        "m", probe, SLA, WORKLOAD, ProfilerConfig(rel_tol=0.01), progress=lambda f, _m: seen.append(f)
    )
    assert 37.3 * 0.99 <= profile.max_rps <= 37.3
    # 7 probes double 1 -> 64, then 7 bisections shrink [32, 64] below 1% of the failing rate
    assert len(probe.rates) == len(set(probe.rates)) == 7 + 7
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)


def test_out_of_probes_while_bisecting_it_answers_with_the_bracket_it_has() -> None:
    # 1 -> 64 doubling takes 7 probes; 3 more leave [36, 40] (a 10% gap) instead of failing the job
    # and throwing away minutes of real-engine probes.
    probe = CountingProbe(threshold=37.3)
    profile = profile_model("m", probe, SLA, WORKLOAD, ProfilerConfig(rel_tol=0.01, max_probes=10))
    assert len(probe.rates) == 10
    assert profile.max_rps == 36.0 and profile.rel_gap == pytest.approx(0.1)
    assert profile.to_dict()["rel_gap"] == pytest.approx(0.1)
    converged = profile_model("m", CountingProbe(threshold=37.3), SLA, WORKLOAD, ProfilerConfig(rel_tol=0.01))
    assert 0 < converged.rel_gap <= 0.01


def test_out_of_probes_before_any_rate_misses_the_sla_it_fails_saying_so() -> None:
    probe = CountingProbe(threshold=1e6)
    with pytest.raises(ProfilingError, match="no rate both met and missed the SLA yet"):
        profile_model("m", probe, SLA, WORKLOAD, ProfilerConfig(max_probes=5, max_rate=1e9))
    assert len(probe.rates) == 5


def test_it_stops_early_when_cancelled() -> None:
    probe = CountingProbe(threshold=37.3)
    polls = iter(range(100))
    with pytest.raises(ProfilingCancelled, match="cancelled after 3 probes"):
        profile_model("m", probe, SLA, WORKLOAD, should_cancel=lambda: next(polls) >= 3)
    assert len(probe.rates) == 3


def test_it_fits_a_cost_model_from_probe_samples() -> None:
    truth = CostModel(PhaseCoeffs(0.004, 3e-5, 6e-10), PhaseCoeffs(0.004, 5e-8, 3e-5), 1024, "truth")
    probe = CountingProbe(threshold=10.0, samples_from=truth, free=900)
    profile = profile_model("m", probe, SLA, WORKLOAD)
    fitted = profile.cost_model
    assert fitted is not None and profile.fit_error is None
    assert fitted.kv_bytes_per_token == 1024
    for chunks in ([128], [512, 512], [2048]):
        assert fitted.prefill_time(chunks) == pytest.approx(truth.prefill_time(chunks), rel=0.03)
    for ctx in ([1000] * 8, [3000] * 32):
        assert fitted.decode_time(ctx) == pytest.approx(truth.decode_time(ctx), rel=0.03)
    # a producer (90% of the KV cache free): lendable = free - 10% margin
    assert profile.role == "producer" and profile.lendable_bytes == 900 - 100
    data = json.loads(json.dumps(profile.to_dict()))
    assert data["cost_model"]["decode"]["c"] == pytest.approx(fitted.decode.c)
    assert [p["rate"] for p in data["curve"]] == sorted(probe.rates)
    assert data["max_rps"] == profile.max_rps and data["role"] == "producer"


def test_tail_percentile_counts_missing_values_as_infinitely_late() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert tail_percentile(values, 0, 50.0) == pytest.approx(50.5)
    assert tail_percentile(values[:99], 1, 50.0) == pytest.approx(50.5)  # same position, finite
    assert tail_percentile(values[:98], 2, 99.0) == math.inf
    assert tail_percentile([], 0, 99.0) == math.inf


def test_a_simulator_calibrated_from_engine_samples_finds_the_engines_max_rate() -> None:
    # the "engine" is the llama-3-8b@h100 preset; its samples (1% timing noise) calibrate a new
    # cost model, and the simulator with that model must agree with the one with the true model
    engine_like = CountingProbe(threshold=10.0, samples_from=COST)
    fitted = profile_model("m", engine_like, SLA, WORKLOAD).cost_model
    assert fitted is not None
    engine = EngineConfig(num_kv_blocks=FULL_BLOCKS)
    config = ProfilerConfig(initial_rate=4.0)
    calibrated = profile_model("m", SimulatorProbe(fitted, engine, WORKLOAD), SLA, WORKLOAD, config)
    reference = profile_model("m", make_probe(), SLA, WORKLOAD, config)
    assert calibrated.max_rps == pytest.approx(reference.max_rps, rel=0.05)
