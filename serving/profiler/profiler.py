"""The Aqua profiler: max rate under the SLA, producer/consumer role, swap space, fitted cost model.

Steps (progress fractions in brackets):
  1. [0, 0.8)   RateSearch finds max_rps, the highest probed rate meeting the SLA.
  2.            At max_rps: free = KV capacity - peak KV use. Producer if free >= producer_threshold x
                capacity and lendable = free - safety_margin x capacity is positive; else consumer.
                A probe that reports no KV capacity is a ProfilingError (no role can be told).
  3. [0.8, 1)   For a consumer, the peak KV demand at each burst level (2x, 4x, 8x max_rps); swap
                needed = demand beyond capacity.
  4.            If the probes returned iteration samples (real engines do), fit a CostModel to them
                (serving.costmodel.fit_cost_model), so a SimulatorProbe can be calibrated from them.
  5. 1.0        done.
Cancellation is checked before every probe; ProfilingCancelled is raised and nothing is returned.
"""

from __future__ import annotations

from serving.costmodel.fit import fit_cost_model
from serving.costmodel.model import CostModel
from serving.profiler.config import (
    LatencySLA,
    ProfilerConfig,
    ProfilingCancelled,
    ProfilingError,
    WorkloadSpec,
)
from serving.profiler.probe import BurstResult, ProbeResult, RateProbe
from serving.profiler.profile import Profile, Role
from serving.profiler.search import CancelFn, ProgressFn, RateSearch

_SEARCH_END = 0.8


def _no_progress(fraction: float, message: str) -> None:
    return None


def _never() -> bool:
    return False


def profile_model(
    model: str,
    probe: RateProbe,
    sla: LatencySLA,
    workload: WorkloadSpec,
    config: ProfilerConfig | None = None,
    *,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
) -> Profile:
    """Profile `model` on `probe` (module docstring).

    Args:
        model: Model name (recorded in the profile).
        probe: Where to run: a SimulatorProbe or an EngineProbe.
        sla: The latency SLA.
        workload: The workload the probe replays (recorded in the profile).
        config: Search and classification settings.
        progress: Called with (fraction, message) after each step; ends with 1.0.
        should_cancel: Polled before every probe.

    Raises:
        ProfilingError: The SLA is missed even at config.min_rate, or the search ran out of probes
            before it had both a passing and a failing rate (after that it answers with the
            bracket it has: Profile.rel_gap).
        ProfilingCancelled: should_cancel returned True.
    """
    config = config or ProfilerConfig()
    progress = progress or _no_progress
    should_cancel = should_cancel or _never
    progress(0.0, f"profiling {model}")
    search = RateSearch(probe, sla, config, progress, should_cancel, span=(0.0, _SEARCH_END)).run()
    at_max = search.at_max
    capacity = at_max.kv_capacity_bytes
    if capacity <= 0:
        # free >= threshold x 0 held for every model: an engine whose KV cache size is unknown
        # (no vLLM cache_config_info metric) was stored as a producer lending 0 bytes, which the
        # place job then refused ("a producer's lendable_bytes=0 must be positive").
        raise ProfilingError(
            f"the probe at {search.max_rate:.4g} req/s reported no KV-cache capacity "
            f"(kv_capacity_bytes={capacity}): the role cannot be told without it (does the engine "
            "export vLLM's cache_config_info metric?)"
        )
    free = at_max.free_kv_bytes
    lendable = max(0, free - int(config.safety_margin * capacity))
    # A producer lends something: at the threshold with safety_margin == producer_threshold (or
    # both 0) the margin takes all it has free, and it was stored as a producer lending 0 bytes.
    is_producer = free >= config.producer_threshold * capacity and lendable > 0
    role: Role = "producer" if is_producer else "consumer"
    lendable = lendable if is_producer else 0
    progress(_SEARCH_END, f"max {search.max_rate:.4g} req/s; {role} with {free} free KV bytes")

    bursts: list[BurstResult] = []
    if role == "consumer":
        for i, factor in enumerate(config.burst_levels):
            if should_cancel():
                raise ProfilingCancelled(
                    f"profiling cancelled while sizing bursts ({i} of {len(config.burst_levels)})"
                )
            burst = probe.measure_burst(search.max_rate, factor)
            bursts.append(burst)
            frac = _SEARCH_END + (1 - _SEARCH_END) * (i + 1) / (len(config.burst_levels) + 1)
            progress(frac, f"burst {factor:g}x: {burst.swap_needed_bytes} bytes to swap")

    cost, fit_error = _fit(model, search.curve, probe.kv_bytes_per_token)
    profile = Profile(
        model=model,
        sla=sla,
        workload=workload,
        curve=search.curve,
        max_rps=search.max_rate,
        capped=search.capped,
        rel_gap=search.rel_gap,
        role=role,
        kv_capacity_bytes=capacity,
        free_kv_bytes=free,
        lendable_bytes=lendable,
        bursts=tuple(bursts),
        cost_model=cost,
        fit_error=fit_error,
    )
    progress(1.0, f"{model}: {profile.max_rps:.4g} req/s, {role}")
    return profile


def _fit(
    model: str, curve: tuple[ProbeResult, ...], kv_bytes_per_token: int
) -> tuple[CostModel | None, str | None]:
    """A CostModel from every probe's samples; (None, None) if the probe gave none."""
    prefill = [s for p in curve for s in p.prefill_samples]
    decode = [s for p in curve for s in p.decode_samples]
    if not prefill and not decode:
        return None, None
    try:
        return fit_cost_model(prefill, decode, kv_bytes_per_token, name=f"{model}/fitted"), None
    except ValueError as exc:
        return None, str(exc)
