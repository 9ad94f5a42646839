"""One entry point for every workload: `make_workload(kind, rate, duration_s, dataset, seed, ...)`.

Randomness is split into independent streams derived from `seed` (numpy SeedSequence.spawn): one
for arrivals, one for lengths, one for SLO classes. So for a given seed the k-th request's lengths do
not depend on the arrival process, and two workload kinds can be compared request for request.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from serving.workload.arrivals import MIN_GAMMA_SHAPE, gamma_arrivals, on_off_arrivals, poisson_arrivals
from serving.workload.datasets import get_length_dist
from serving.workload.lengths import LengthDistribution
from serving.workload.request import Request
from serving.workload.trace import load_trace

WORKLOAD_KINDS: tuple[str, ...] = ("poisson", "gamma", "burst", "trace")

# kind -> extra keyword arguments it accepts (beyond the common max_context / slo_class / slo_mix)
_KIND_KWARGS: dict[str, frozenset[str]] = {
    "poisson": frozenset(),
    "gamma": frozenset({"burstiness"}),
    "burst": frozenset({"burst_factor", "burst_duration_s", "period_s", "burst_start_s"}),
    "trace": frozenset({"path", "time_scale", "max_requests"}),
}
_COMMON_KWARGS = frozenset({"max_context", "slo_class", "slo_mix"})


def requests_from_arrivals(
    arrivals: np.ndarray,
    dist: LengthDistribution,
    rng: np.random.Generator,
    max_context: int | None = None,
) -> list[Request]:
    """Attach sampled lengths to sorted arrival times; req_ids are dense in arrival order."""
    prompts, outputs = dist.sample(len(arrivals), rng, max_context)
    # plain Python numbers: building 10^5 Requests from numpy scalars is several times slower
    rows = zip(arrivals.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
    return [Request(i, t, p, o) for i, (t, p, o) in enumerate(rows)]


def _assign_classes(
    requests: list[Request],
    slo_class: str | None,
    slo_mix: Mapping[str, float] | None,
    rng: np.random.Generator,
) -> list[Request]:
    if slo_mix is None:
        if slo_class is None:
            return requests
        return [Request(r.req_id, r.arrival, r.prompt_tokens, r.output_tokens, slo_class) for r in requests]
    if slo_class is not None:
        raise ValueError("give slo_class or slo_mix, not both")
    names = sorted(slo_mix)
    weights = np.array([slo_mix[n] for n in names], dtype=float)
    if not names or np.any(~np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"{slo_mix=} needs non-negative finite weights with a positive sum")
    picks = rng.choice(len(names), size=len(requests), p=weights / weights.sum())
    return [
        Request(r.req_id, r.arrival, r.prompt_tokens, r.output_tokens, names[k])
        for r, k in zip(requests, picks, strict=True)
    ]


def make_workload(
    kind: str,
    rate: float | None,
    duration_s: float,
    dataset: str = "sharegpt",
    seed: int = 0,
    **kw: Any,
) -> list[Request]:
    """Generate (or replay) a workload.

    Args:
        kind: "poisson", "gamma", "burst" or "trace".
        rate: Mean arrival rate (requests/s); for "burst" the base rate outside bursts; for
            "trace" the trace is time-scaled to this mean rate, or replayed as recorded if None
            (a trace of one request is the same at every rate; one of several requests all at one
            instant has no rate to scale to, and raises).
        duration_s: Arrivals fall in [0, duration_s).
        dataset: Length distribution name (see `available_length_dists()`); ignored for "trace",
            whose lengths come from the file.
        seed: Seed of every random choice.
        **kw: Per kind: gamma: burstiness (gamma shape, default 0.5); burst: burst_factor (4.0),
            burst_duration_s (10.0), period_s (60.0), burst_start_s (centred); trace: path
            (required), time_scale (1.0, applied when rate is None), max_requests. Common:
            max_context (cap on prompt + output, default the dataset's), slo_class (one class for
            every request) or slo_mix (class -> weight, drawn per request).

    Returns:
        Requests sorted by arrival, req_ids 0..n-1.

    Raises:
        ValueError: Unknown kind, dataset or keyword, or an invalid value (a rate for a trace whose
            requests all arrive at one instant included).
    """
    if kind not in _KIND_KWARGS:
        raise ValueError(f"unknown workload kind {kind!r}; choose one of: {', '.join(WORKLOAD_KINDS)}")
    unknown = set(kw) - _KIND_KWARGS[kind] - _COMMON_KWARGS
    if unknown:
        allowed = sorted(_KIND_KWARGS[kind] | _COMMON_KWARGS)
        raise ValueError(f"unknown option(s) {sorted(unknown)} for {kind!r}; allowed: {', '.join(allowed)}")
    if not duration_s >= 0 or math.isinf(duration_s):
        raise ValueError(f"{duration_s=} must be >= 0 and finite")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"{seed=} must be an integer >= 0")
    arrival_ss, length_ss, class_ss = np.random.SeedSequence(seed).spawn(3)
    max_context = kw.get("max_context")
    if max_context is not None and max_context < 2:
        raise ValueError(f"{max_context=} must be >= 2")
    if kind == "trace":
        requests = _trace(rate, duration_s, kw)
    else:
        if rate is None:
            raise ValueError(f"rate is required for {kind!r} workloads")
        dist = get_length_dist(dataset)  # before any sampling: an unknown name raises, listing valid ones
        rng = np.random.default_rng(arrival_ss)
        if kind == "poisson":
            arrivals = poisson_arrivals(rate, duration_s, rng)
        elif kind == "gamma":
            shape = kw.get("burstiness", 0.5)
            if not shape >= MIN_GAMMA_SHAPE or math.isinf(shape):  # named as the caller named it
                raise ValueError(f"burstiness={shape} must be a finite number >= {MIN_GAMMA_SHAPE}")
            arrivals = gamma_arrivals(rate, duration_s, shape, rng)
        else:
            burst_kw = {k: kw[k] for k in _KIND_KWARGS["burst"] if k in kw}
            arrivals = on_off_arrivals(rate, duration_s, rng, **burst_kw)
        requests = requests_from_arrivals(arrivals, dist, np.random.default_rng(length_ss), max_context)
    return _assign_classes(requests, kw.get("slo_class"), kw.get("slo_mix"), np.random.default_rng(class_ss))


def _trace(rate: float | None, duration_s: float, kw: Mapping[str, Any]) -> list[Request]:
    if "path" not in kw:
        raise ValueError("trace workloads need path=<csv file>")
    if rate is None:
        reqs = load_trace(kw["path"], kw.get("time_scale", 1.0), duration_s, kw.get("max_requests"))
    else:
        if not rate > 0 or math.isinf(rate):
            raise ValueError(f"{rate=} must be a positive finite number (or None to replay as recorded)")
        full = load_trace(kw["path"], 1.0, None, kw.get("max_requests"))
        span = full[-1].arrival if len(full) > 1 else 0.0
        if len(full) > 1 and span == 0:
            # Scaling time leaves them all at 0: there is no mean rate to set (it was ignored).
            raise ValueError(
                f"{rate=} cannot time-scale {kw['path']}: its {len(full)} requests all arrive at one "
                "instant, so there are no gaps to scale; replay it as recorded (no rate)"
            )
        # n requests over the span at `rate` means the last arrives at (n - 1) / rate.
        scale = (len(full) - 1) / rate / span if span > 0 else 1.0
        reqs = load_trace(kw["path"], scale, duration_s, kw.get("max_requests"))
    max_context = kw.get("max_context")
    if max_context is not None:
        reqs = [_clamp(r, max_context) for r in reqs]
    return reqs


def _clamp(r: Request, max_context: int) -> Request:
    output = min(r.output_tokens, max_context - 1)
    prompt = min(r.prompt_tokens, max_context - output)
    return Request(r.req_id, r.arrival, prompt, output, r.slo_class)
