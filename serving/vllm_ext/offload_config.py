"""Typed options of the Aqua connector, read from `kv_connector_extra_config`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any

from serving.aqua.offload.lent import CALL_TIMEOUT_S

STATS_DIR_ENV = "AQUA_STATS_DIR"


@dataclass(frozen=True)
class OffloadConfig:
    """Where a preempted request's KV goes and where counters are published.

    Attributes:
        dram_bytes: Host DRAM the worker may hold for offloaded KV (the fallback tier).
        coordinator: Socket path of the aqua coordinator; None disables lent regions.
        consumer_id: This engine's id at the coordinator.
        lent_bytes: Size of the allocation requested from a lent region; when no producer lends
            that much, the engine takes the largest piece one lends that holds the request at hand.
        coordinator_timeout_s: Seconds any one coordinator call may take (they run on the engine's
            step); one that times out ends the session and the engine uses DRAM until a new one.
        stats_dir: Directory for the counters files; defaults to $AQUA_STATS_DIR, else none.
        test_corrupt_file: TEST ONLY: while this file exists, one block of every restore is
            overwritten with noise (proves that the correctness tests can fail).
    """

    dram_bytes: int = 1 << 30
    coordinator: str | None = None
    consumer_id: str = "vllm-engine"
    lent_bytes: int = 64 << 20
    coordinator_timeout_s: float = CALL_TIMEOUT_S
    stats_dir: str | None = None
    test_corrupt_file: str | None = None

    def __post_init__(self) -> None:
        if self.dram_bytes < 0:
            raise ValueError(f"{self.dram_bytes=} must be >= 0")
        if self.lent_bytes <= 0:
            raise ValueError(f"{self.lent_bytes=} must be positive")
        if not (self.coordinator_timeout_s > 0 and math.isfinite(self.coordinator_timeout_s)):
            raise ValueError(f"{self.coordinator_timeout_s=} must be positive and finite")
        if not self.consumer_id:
            raise ValueError("consumer_id must be a non-empty string")

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> OffloadConfig:
        """Build from `kv_connector_extra_config`; unknown keys raise ValueError naming them."""
        extra = dict(extra or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"unknown AquaConnector options {unknown}; known: {sorted(known)}")
        if extra.get("stats_dir") is None and os.environ.get(STATS_DIR_ENV):
            extra["stats_dir"] = os.environ[STATS_DIR_ENV]
        return cls(**extra)
