"""The profiler's role at the edges: an engine whose KV capacity is unknown, a producer whose safety
margin takes all it has free, and profiles stored before either was refused."""

from __future__ import annotations

import dataclasses

import pytest

from serving.placement import ModelProfile
from serving.profiler import (
    BurstResult,
    LatencySLA,
    ProbeResult,
    ProfilerConfig,
    ProfilingError,
    RateProbe,
    WorkloadSpec,
    model_profile_from_dict,
    profile_model,
)

SLA = LatencySLA(ttft_p99_s=0.2, tbt_p99_s=0.05)
WORKLOAD = WorkloadSpec(num_requests=50, seed=1)


class FixedProbe(RateProbe):
    """Meets the SLA up to 5 req/s, with `free` of `capacity` KV bytes unused; a burst needs 100 x
    factor bytes beyond the capacity."""

    def __init__(self, capacity: int, free: int) -> None:
        self.capacity = capacity
        self.free = free

    @property
    def kv_bytes_per_token(self) -> int:
        return 1024

    def measure(self, rate: float) -> ProbeResult:
        ttft = 0.1 if rate <= 5.0 else 1.0
        return ProbeResult(rate, ttft, 0.01, ttft, 0.01, 50, 50, self.capacity, self.capacity - self.free)

    def measure_burst(self, rate: float, factor: float) -> BurstResult:
        return BurstResult(rate, factor, self.capacity + int(100 * factor), self.capacity)


def test_it_refuses_to_classify_an_engine_that_reports_no_kv_capacity() -> None:
    # An agent that cannot read the engine's cache size reports 0: free >= 0.3 x 0 made every such
    # model a producer lending 0 bytes, which every place job then refused.
    with pytest.raises(ProfilingError, match="no KV-cache capacity"):
        profile_model("blind", FixedProbe(capacity=0, free=0), SLA, WORKLOAD)


@pytest.mark.parametrize(
    ("threshold", "margin", "free", "role", "lendable"),
    [
        (0.3, 0.1, 300, "producer", 200),  # exactly at the threshold: a producer
        (0.3, 0.1, 299, "consumer", 0),  # just below it
        (0.3, 0.3, 300, "consumer", 0),  # at the threshold, but the margin takes it all
        (0.3, 0.3, 301, "producer", 1),
        (0.0, 0.0, 0, "consumer", 0),  # no threshold, nothing free: nothing to lend
    ],
)
def test_a_producer_is_a_model_with_bytes_to_lend(
    threshold: float, margin: float, free: int, role: str, lendable: int
) -> None:
    config = ProfilerConfig(producer_threshold=threshold, safety_margin=margin)
    profile = profile_model("m", FixedProbe(capacity=1000, free=free), SLA, WORKLOAD, config)
    assert (profile.role, profile.lendable_bytes) == (role, lendable)
    placed = profile.to_model_profile(tp=1, burst_level=4.0)  # what a place job makes of it
    if role == "producer":
        assert placed == ModelProfile("m", "producer", 1, lendable_bytes=lendable, max_rps=profile.max_rps)
    else:
        assert placed == ModelProfile("m", "consumer", 1, needed_bytes=400, max_rps=profile.max_rps)


def test_a_stored_producer_lending_nothing_is_placed_as_neutral() -> None:
    profile = profile_model("m", FixedProbe(capacity=1000, free=500), SLA, WORKLOAD)
    stored = dataclasses.replace(profile, lendable_bytes=0).to_dict()  # as stored before the fix
    assert model_profile_from_dict(stored, tp=2) == ModelProfile("m", "neutral", 2, max_rps=profile.max_rps)
