"""The rate-probe interface: run a model's workload at one rate and report latencies and memory.

Primitives a probe provides:
  measure(rate)               -> ProbeResult: P99 TTFT / TBT, KV capacity and peak use, and (when
                                 the backend can time its iterations) cost-model samples;
  measure_burst(rate, factor) -> BurstResult: the peak KV demand when the rate jumps to
                                 factor x rate for a while, as if KV capacity were unlimited;
  kv_bytes_per_token          -> for fitting a CostModel from the samples.
Implementations: SimulatorProbe (serving/sim) and EngineProbe (a real engine through its agent).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from serving.profiler.config import LatencySLA

Sample = tuple[tuple[int, ...], float]  # (batch composition, measured seconds)


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe at one rate saw.

    Attributes:
        rate: Offered request rate (requests/s).
        ttft_p99_s: 99th percentile TTFT over all requests; inf when more than 1% of requests
            produced no token (rejected or cut off).
        tbt_p99_s: 99th percentile of all inter-token gaps; 0.0 when there are none (one-token
            answers meet any pacing target).
        ttft_p50_s: Median TTFT (for the curve).
        tbt_p50_s: Median inter-token gap.
        num_requests: Requests replayed.
        finished: Requests that emitted every token.
        kv_capacity_bytes: The engine's KV-cache capacity.
        peak_kv_used_bytes: The most KV memory in use at any moment of the run.
        prefill_samples: (prefill chunk lengths, seconds) of timed iterations, if the backend
            records them.
        decode_samples: (decode context lengths, seconds) of timed iterations, likewise.
    """

    rate: float
    ttft_p99_s: float
    tbt_p99_s: float
    ttft_p50_s: float
    tbt_p50_s: float
    num_requests: int
    finished: int
    kv_capacity_bytes: int
    peak_kv_used_bytes: int
    prefill_samples: tuple[Sample, ...] = field(default=(), repr=False)
    decode_samples: tuple[Sample, ...] = field(default=(), repr=False)

    @property
    def free_kv_bytes(self) -> int:
        """KV memory never used during the run: what the engine could have lent."""
        return max(0, self.kv_capacity_bytes - self.peak_kv_used_bytes)

    def meets(self, sla: LatencySLA) -> bool:
        """Both P99s within the SLA (inclusive)."""
        return self.ttft_p99_s <= sla.ttft_p99_s and self.tbt_p99_s <= sla.tbt_p99_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (infinite percentiles become null; samples are counted, not listed)."""
        return {
            "rate": self.rate,
            "ttft_p99_s": _json_float(self.ttft_p99_s),
            "tbt_p99_s": _json_float(self.tbt_p99_s),
            "ttft_p50_s": _json_float(self.ttft_p50_s),
            "tbt_p50_s": _json_float(self.tbt_p50_s),
            "num_requests": self.num_requests,
            "finished": self.finished,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "peak_kv_used_bytes": self.peak_kv_used_bytes,
            "free_kv_bytes": self.free_kv_bytes,
            "prefill_samples": len(self.prefill_samples),
            "decode_samples": len(self.decode_samples),
        }


@dataclass(frozen=True, slots=True)
class BurstResult:
    """KV demand under a burst.

    Attributes:
        rate: Base rate (requests/s).
        factor: The burst's rate multiplier.
        peak_kv_demand_bytes: The most KV memory the engine would have held at once with unlimited
            capacity (its scheduler's sequence and token limits still apply).
        kv_capacity_bytes: The engine's real KV capacity.
    """

    rate: float
    factor: float
    peak_kv_demand_bytes: int
    kv_capacity_bytes: int

    @property
    def swap_needed_bytes(self) -> int:
        """Demand beyond capacity: what must be swapped out (to lent memory or DRAM)."""
        return max(0, self.peak_kv_demand_bytes - self.kv_capacity_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "factor": self.factor,
            "peak_kv_demand_bytes": self.peak_kv_demand_bytes,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "swap_needed_bytes": self.swap_needed_bytes,
        }


class RateProbe(ABC):
    """Runs a model's workload at a given rate on some backend and reports what it saw."""

    @property
    @abstractmethod
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies in this model (for fitting a CostModel to samples)."""

    @abstractmethod
    def measure(self, rate: float) -> ProbeResult:
        """Replay the workload at `rate` and measure it.

        Called by the profiler once per probed rate (never twice for one rate), in search order.

        Args:
            rate: Offered load in requests/s (> 0).

        Returns:
            The latencies, memory use and any iteration samples of the run.
        """

    @abstractmethod
    def measure_burst(self, rate: float, factor: float) -> BurstResult:
        """Replay the workload at `rate` with a burst of `factor` x rate and size its KV demand.

        Called for consumers only, once per burst level, after the max rate is known.

        Args:
            rate: Base rate (the model's max rate under its SLA).
            factor: Burst multiplier (e.g. 2, 4, 8).

        Returns:
            The peak KV demand and the capacity it is compared with.
        """
