"""A rate probe on the simulator (serving/sim) with the model's cost model.

Peak KV use is measured exactly by a KV-cache accountant that remembers its lowest free-block count
(the engine allocates and frees through `free`). Burst demand is measured on the same engine with a
KV cache larger than the burst could ever fill, so nothing is preempted and the peak is the demand.
The simulator's iteration times come from the cost model itself, so it reports no cost-model
samples: samples come from real engines (EngineProbe), and a CostModel fitted to them is what a
calibrated SimulatorProbe is built with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from serving.costmodel.model import CostModel
from serving.metrics import tbts
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.profiler.config import WorkloadSpec
from serving.profiler.probe import BurstResult, ProbeResult, RateProbe
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.kv import KVCache
from serving.workload.request import Request


class _PeakKVCache(KVCache):
    """A KVCache that remembers the fewest free blocks it ever had."""

    __slots__ = ("_free", "min_free")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.min_free = num_blocks
        super().__init__(num_blocks, block_size)

    @property
    def free(self) -> int:
        return self._free

    @free.setter
    def free(self, value: int) -> None:
        self._free = value
        if value < self.min_free:
            self.min_free = value


def tail_percentile(values: Sequence[float], missing: int, q: float) -> float:
    """q-th percentile (linear interpolation) of `values` plus `missing` infinitely large values:
    inf when the interpolation touches one of those, else finite."""
    n = len(values) + missing
    if n == 0:
        return math.inf
    pos = q / 100.0 * (n - 1)
    if math.ceil(pos) >= len(values):
        return math.inf
    return float(np.percentile(np.asarray(values, dtype=float), 100.0 * pos / max(len(values) - 1, 1)))


class SimulatorProbe(RateProbe):
    """Probes a model on one simulated engine (`EngineSim`) under a scheduling policy."""

    def __init__(
        self,
        cost: CostModel,
        engine: EngineConfig,
        workload: WorkloadSpec,
        policy: str = "fcfs",
        policy_options: Mapping[str, Any] | None = None,
    ) -> None:
        """
        Args:
            cost: The model's cost model (a preset, or one fitted to an engine's samples).
            engine: The engine's limits; `num_kv_blocks` is its KV capacity.
            workload: The workload replayed at each rate.
            policy: Scheduling policy name (serving/policies registry).
            policy_options: Keyword options of the policy.
        """
        self.cost = cost
        self.engine = engine
        self.workload = workload
        self.policy = policy
        self.policy_options = dict(policy_options or {})
        get_policy(policy, **self.policy_options)  # an unknown policy fails here, not mid-search

    @property
    def kv_bytes_per_token(self) -> int:
        return self.cost.kv_bytes_per_token

    @property
    def kv_capacity_bytes(self) -> int:
        return self.engine.num_kv_blocks * self.engine.block_size * self.cost.kv_bytes_per_token

    def _run(self, config: EngineConfig, requests: list[Request]) -> tuple[list[RequestRecord], int]:
        """Records and peak KV bytes used."""
        sim = EngineSim(self.cost, config, get_policy(self.policy, **self.policy_options))
        sim.kv = kv = _PeakKVCache(config.num_kv_blocks, config.block_size)
        records = sim.run(requests)
        peak_blocks = kv.total - kv.min_free
        return records, peak_blocks * config.block_size * self.cost.kv_bytes_per_token

    def measure(self, rate: float) -> ProbeResult:
        records, peak = self._run(self.engine, self.workload.requests(rate))
        firsts = [r.token_times[0] - r.arrival for r in records if r.token_times]
        gaps = tbts(records)
        missing = len(records) - len(firsts)
        return ProbeResult(
            rate=rate,
            ttft_p99_s=tail_percentile(firsts, missing, 99.0),
            tbt_p99_s=tail_percentile(gaps, 0, 99.0) if gaps else 0.0,
            ttft_p50_s=tail_percentile(firsts, missing, 50.0),
            tbt_p50_s=tail_percentile(gaps, 0, 50.0) if gaps else 0.0,
            num_requests=len(records),
            finished=sum(r.finished for r in records),
            kv_capacity_bytes=self.kv_capacity_bytes,
            peak_kv_used_bytes=peak,
        )

    def measure_burst(self, rate: float, factor: float) -> BurstResult:
        requests = self.workload.burst_requests(rate, factor)
        bs = self.engine.block_size
        # room for every request's whole sequence at once: the cache can never run out
        unlimited = sum(-(-(r.prompt_tokens + r.output_tokens) // bs) for r in requests) + 1
        config = replace(self.engine, num_kv_blocks=max(unlimited, self.engine.num_kv_blocks))
        _, peak = self._run(config, requests)
        return BurstResult(rate, factor, peak, self.kv_capacity_bytes)
