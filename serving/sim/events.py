"""Timed memory changes an engine applies during a run, and the counters it keeps."""

from __future__ import annotations

from dataclasses import dataclass

# Kinds of timed changes; at equal times the lower kind applies first, then arrivals.
KV_GROW, PEER_CAPACITY = 0, 1


@dataclass(frozen=True, slots=True)
class TimedChange:
    """A change to an engine's memory at a set time (memory lending and reclaim).

    Attributes:
        time: When it happens (s); applied at the first iteration boundary at or after it.
        kind: KV_GROW (add `value` KV blocks) or PEER_CAPACITY (set lent peer bytes to `value`).
        event_id: Tie-breaker among changes at the same time and kind.
        value: Blocks to add, or the new lent capacity in bytes.
    """

    time: float
    kind: int
    event_id: int
    value: int


@dataclass(slots=True)
class EngineStats:
    """Counters of one run."""

    iterations: int = 0
    fast_forwarded_iterations: int = 0
    preemptions: int = 0
    rotations: int = 0
    rejected: int = 0
    transfer_seconds: float = 0.0
    end_time: float = 0.0
