"""A model's profile: its latency-vs-rate curve, max rate under the SLA, role and memory figures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from serving.costmodel.model import CostModel
from serving.profiler.config import (
    LatencySLA,
    ProfilingError,
    WorkloadSpec,
    burst_key,
    check_distinct_burst_levels,
)
from serving.profiler.probe import BurstResult, ProbeResult

Role = Literal["producer", "consumer"]


@dataclass(frozen=True, slots=True)
class Profile:
    """The profiler's result for one model.

    Attributes:
        model: Model name.
        sla: The SLA searched against.
        workload: The workload replayed.
        curve: Every probe, sorted by rate.
        max_rps: Highest probed rate meeting the SLA.
        capped: True if max_rps is the configured ceiling (the real maximum may be higher).
        rel_gap: How far below the lowest failing rate probed max_rps is, relative to it: at most
            the search's rel_tol unless its max_probes ran out first (SearchResult.rel_gap).
        role: "producer" if free KV memory at max_rps >= producer_threshold x capacity and it
            has bytes to lend after the safety margin, else "consumer".
        kv_capacity_bytes: KV capacity of the engine.
        free_kv_bytes: KV memory unused at max_rps (capacity - peak use).
        lendable_bytes: free - safety margin for a producer; 0 for a consumer.
        bursts: For a consumer, the KV demand at each burst level (empty for a producer).
        cost_model: A CostModel fitted to the probes' iteration samples, when they provided enough.
        fit_error: Why no cost model was fitted, when samples were provided but did not suffice.
    """

    model: str
    sla: LatencySLA
    workload: WorkloadSpec
    curve: tuple[ProbeResult, ...]
    max_rps: float
    capped: bool
    role: Role
    kv_capacity_bytes: int
    free_kv_bytes: int
    lendable_bytes: int
    bursts: tuple[BurstResult, ...]
    cost_model: CostModel | None = None
    fit_error: str | None = None
    rel_gap: float = 0.0

    def __post_init__(self) -> None:
        # to_dict keys swap needs by burst_key: two levels named alike would overwrite each other.
        check_distinct_burst_levels([b.factor for b in self.bursts])

    @property
    def swap_needed_bytes(self) -> dict[float, int]:
        """Burst factor -> bytes a consumer must swap out at that burst."""
        return {b.factor: b.swap_needed_bytes for b in self.bursts}

    def to_model_profile(self, tp: int = 1, burst_level: float = 4.0) -> Any:
        """The placer's view of this model; see `model_profile_from_dict`."""
        return model_profile_from_dict(self.to_dict(), tp, burst_level)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (plain dicts, lists, numbers, strings, null)."""
        cost = None
        if self.cost_model is not None:
            cm = self.cost_model
            cost = {
                "name": cm.name,
                "prefill": {"a": cm.prefill.a, "b": cm.prefill.b, "c": cm.prefill.c},
                "decode": {"a": cm.decode.a, "b": cm.decode.b, "c": cm.decode.c},
                "kv_bytes_per_token": cm.kv_bytes_per_token,
            }
        return {
            "model": self.model,
            "sla": self.sla.to_dict(),
            "workload": self.workload.to_dict(),
            "curve": [p.to_dict() for p in self.curve],
            "max_rps": self.max_rps,
            "capped": self.capped,
            "rel_gap": self.rel_gap,
            "role": self.role,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "free_kv_bytes": self.free_kv_bytes,
            "lendable_bytes": self.lendable_bytes,
            "swap_needed_bytes": {burst_key(b.factor): b.swap_needed_bytes for b in self.bursts},
            "bursts": [b.to_dict() for b in self.bursts],
            "cost_model": cost,
            "fit_error": self.fit_error,
        }


def model_profile_from_dict(data: Mapping[str, Any], tp: int = 1, burst_level: float = 4.0) -> Any:
    """A serving.placement.ModelProfile from a stored `Profile.to_dict()`.

    A consumer that needs no swap space at `burst_level` (that burst fits its own KV cache) is
    placed as a "neutral" model: it gets GPUs, but neither a lender nor a DRAM fallback, since it
    borrows nothing at that level. So is a producer stored lending 0 bytes (the profiler made such
    models producers before it required a producer to lend something).

    Args:
        data: The stored profile.
        tp: GPUs the model runs on.
        burst_level: Which burst level's swap need a consumer is placed for.

    Raises:
        ProfilingError: A missing field, or a burst level that was not profiled.
    """
    from serving.placement import ModelProfile

    try:
        name, role, max_rps = data["model"], data["role"], data["max_rps"]
        if role == "producer":
            if not data["lendable_bytes"]:
                # stored before the profiler made a producer lend something: it lends nothing
                return ModelProfile(name, "neutral", tp, max_rps=max_rps)
            return ModelProfile(name, "producer", tp, lendable_bytes=data["lendable_bytes"], max_rps=max_rps)
        needs: Mapping[str, int] = data["swap_needed_bytes"]
    except KeyError as exc:
        raise ProfilingError(f"stored profile lacks {exc}") from None
    key = burst_key(burst_level)
    if key not in needs:
        raise ProfilingError(f"burst level {key} was not profiled (have {', '.join(needs) or 'none'})")
    if needs[key] == 0:
        return ModelProfile(name, "neutral", tp, max_rps=max_rps)
    return ModelProfile(name, "consumer", tp, needed_bytes=needs[key], max_rps=max_rps)
