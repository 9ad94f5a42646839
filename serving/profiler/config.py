"""What the profiler is given: the SLA, the workload shape and the search settings; its errors."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from serving.workload import get_length_dist, make_workload
from serving.workload.arrivals import MIN_GAMMA_SHAPE
from serving.workload.request import Request


class ProfilingError(ValueError):
    """The profile cannot be computed (e.g. the SLA is missed even at the lowest rate)."""


class ProfilingCancelled(RuntimeError):
    """The caller's `should_cancel` returned True; the profiler stopped before finishing."""


def _positive_finite(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}={value!r} must be a positive finite number")


def burst_key(factor: float) -> str:
    """How a burst level is named in a stored profile (`swap_needed_bytes`), e.g. "4x"."""
    return f"{factor:g}x"


def check_distinct_burst_levels(levels: tuple[float, ...] | list[float]) -> None:
    """Refuse two burst levels named alike (4.0 and 4.0000001 are both "4x"): a stored profile
    keys its swap needs by that name, so one level's figure would silently replace the other's."""
    seen: dict[str, float] = {}
    for level in levels:
        key = burst_key(level)
        if key in seen:
            raise ValueError(
                f"burst levels {seen[key]!r} and {level!r} are both {key!r}: give distinct levels"
            )
        seen[key] = level


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class LatencySLA:
    """A model's latency targets, on whole-run percentiles.

    Attributes:
        ttft_p99_s: Max 99th percentile of time to first token over all requests (s).
        tbt_p99_s: Max 99th percentile of the time between consecutive tokens over all tokens of
            all requests (s).
    """

    ttft_p99_s: float
    tbt_p99_s: float

    def __post_init__(self) -> None:
        _positive_finite("ttft_p99_s", self.ttft_p99_s)
        _positive_finite("tbt_p99_s", self.tbt_p99_s)

    def to_dict(self) -> dict[str, float]:
        return {"ttft_p99_s": self.ttft_p99_s, "tbt_p99_s": self.tbt_p99_s}


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The workload replayed at each probed rate.

    A probe at rate r replays `num_requests` requests over num_requests / r seconds. With one seed,
    every rate sees the same requests (same lengths) with arrival times scaled by 1 / r, so the
    latency-vs-rate curve is not blurred by drawing a new workload per rate.

    Attributes:
        kind: Arrival process: "poisson" or "gamma" (serving/workload).
        dataset: Length distribution name (serving/workload/datasets.py).
        num_requests: Requests per probe (about; the arrival process decides the exact count).
        seed: Seed of the workload.
        burstiness: Gamma shape for kind="gamma" (CV of the gaps = 1 / sqrt(shape)).
        max_context: Cap on prompt + output tokens, or None for the dataset's.
        burst_duration_s: Length of the burst used to size a consumer's swap space.
    """

    kind: str = "poisson"
    dataset: str = "sharegpt"
    num_requests: int = 500
    seed: int = 0
    burstiness: float = 0.5
    max_context: int | None = None
    burst_duration_s: float = 10.0

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "gamma"):
            raise ValueError(f"{self.kind=} must be 'poisson' or 'gamma'")
        # Caught here, not at the first probe (a NaN num_requests passed `< 1` and the probe then
        # failed on a duration_s nobody gave; a negative seed or a max_context of 1 likewise).
        if not _is_int(self.num_requests) or self.num_requests < 1:
            raise ValueError(f"{self.num_requests=} must be a positive integer")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"{self.seed=} must be an integer >= 0")
        if self.max_context is not None and (not _is_int(self.max_context) or self.max_context < 2):
            raise ValueError(f"{self.max_context=} must be an integer >= 2 (one prompt and one output token)")
        _positive_finite("burstiness", self.burstiness)
        if self.burstiness < MIN_GAMMA_SHAPE:  # caught here, not at the first probe's make_workload
            raise ValueError(f"burstiness={self.burstiness} must be >= {MIN_GAMMA_SHAPE} (gap CV <= 10)")
        _positive_finite("burst_duration_s", self.burst_duration_s)
        get_length_dist(self.dataset)  # an unknown dataset fails here, listing the known ones

    def requests(self, rate: float) -> list[Request]:
        """The workload at `rate` requests/s.

        Raises:
            ProfilingError: It draws no requests (a `num_requests` of a few can draw none).
        """
        _positive_finite("rate", rate)
        kw: dict[str, Any] = {"max_context": self.max_context}
        if self.kind == "gamma":
            kw["burstiness"] = self.burstiness
        requests = make_workload(self.kind, rate, self.num_requests / rate, self.dataset, self.seed, **kw)
        if not requests:  # nothing to measure: not an SLA missed (every TTFT would read as inf)
            raise ProfilingError(
                f"the workload draws no requests at {rate:.4g} req/s ({self.num_requests=}, "
                f"{self.seed=}); raise num_requests"
            )
        return requests

    def burst_window_s(self, rate: float) -> float:
        """The length of `burst_requests`' window at `rate`; its burst is centred in it, so it ends
        at (window + burst_duration_s) / 2."""
        return max(self.num_requests / rate, 3 * self.burst_duration_s)

    def burst_requests(self, rate: float, factor: float) -> list[Request]:
        """Poisson arrivals at `rate` with one burst of `factor` x rate for `burst_duration_s`,
        centred in a window of max(num_requests / rate, 3 x burst_duration_s) seconds."""
        _positive_finite("rate", rate)
        _positive_finite("factor", factor)
        duration = self.burst_window_s(rate)
        return make_workload(
            "burst",
            rate,
            duration,
            self.dataset,
            self.seed,
            burst_factor=factor,
            burst_duration_s=self.burst_duration_s,
            period_s=duration,
            max_context=self.max_context,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dataset": self.dataset,
            "num_requests": self.num_requests,
            "seed": self.seed,
            "burstiness": self.burstiness,
            "max_context": self.max_context,
            "burst_duration_s": self.burst_duration_s,
        }


@dataclass(frozen=True, slots=True)
class ProfilerConfig:
    """Search and classification settings.

    Attributes:
        initial_rate: First rate probed (requests/s); the search doubles or halves from it.
        min_rate: Lowest rate tried; missing the SLA there is a ProfilingError.
        max_rate: Highest rate tried; meeting the SLA there ends the search (`Profile.capped`).
        rel_tol: Bisection stops when (fail - pass) / fail <= rel_tol.
        max_probes: Cap on rate probes (bracketing + bisection).
        producer_threshold: A model is a producer if its free KV memory at the max rate is at
            least this fraction of its KV capacity.
        safety_margin: Lendable bytes = free - safety_margin x capacity (headroom for the producer's
            own load spikes).
        burst_levels: Burst factors (x max rate) at which a consumer's swap space is sized.
    """

    initial_rate: float = 1.0
    min_rate: float = 0.01
    max_rate: float = 10_000.0
    rel_tol: float = 0.01
    max_probes: int = 40
    producer_threshold: float = 0.3
    safety_margin: float = 0.1
    burst_levels: tuple[float, ...] = field(default=(2.0, 4.0, 8.0))

    def __post_init__(self) -> None:
        for name in ("initial_rate", "min_rate", "max_rate", "rel_tol"):
            _positive_finite(name, getattr(self, name))
        if not self.min_rate <= self.initial_rate <= self.max_rate:
            raise ValueError(f"need {self.min_rate=} <= {self.initial_rate=} <= {self.max_rate=}")
        if self.rel_tol >= 1:
            raise ValueError(f"{self.rel_tol=} must be < 1")
        if self.max_probes < 2:
            raise ValueError(f"{self.max_probes=} must be >= 2")
        if not 0 <= self.safety_margin <= self.producer_threshold <= 1:
            raise ValueError(f"need 0 <= {self.safety_margin=} <= {self.producer_threshold=} <= 1")
        for level in self.burst_levels:
            _positive_finite("burst level", level)
        check_distinct_burst_levels(self.burst_levels)
