"""A rate probe on the simulator (serving/sim) with the model's cost model.

Peak KV use is measured exactly by a KV-cache accountant that remembers its lowest free-block count
(the engine allocates and frees through `free`). Burst demand is measured on the same engine with a
KV cache larger than the burst could ever fill, so nothing is preempted and the peak is the demand.
The simulator's iteration times come from the cost model itself, so it reports no cost-model
samples: samples come from real engines (EngineProbe), and a CostModel fitted to them is what a
calibrated SimulatorProbe is built with.
The probe is told the GPU it runs on (a cost-model preset GPU, as a simulated host's engines are):
an offload_peer engine saves preempted KV into memory a peer lends over that GPU's own NVLink
(`costmodel.nvlink`: NVLink 3 on an A100, 4 on an H100), so such an engine cannot be probed without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from serving.costmodel.gpus import get_gpu
from serving.costmodel.model import CostModel
from serving.costmodel.transfer import nvlink
from serving.metrics import tbts
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.profiler.config import WorkloadSpec
from serving.profiler.probe import BurstResult, ProbeResult, RateProbe
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.kv import KVCache
from serving.sim.preemption import PeerStore
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
        *,
        gpu: str | None = None,
    ) -> None:
        """
        Args:
            cost: The model's cost model (a preset, or one fitted to an engine's samples).
            engine: The engine's limits; `num_kv_blocks` is its KV capacity.
            workload: The workload replayed at each rate.
            policy: Scheduling policy name (serving/policies registry).
            policy_options: Keyword options of the policy.
            gpu: The GPU it runs on (serving/costmodel/gpus.py, e.g. "h100"); required for an
                offload_peer engine, whose lent memory is reached over that GPU's own NVLink.

        Raises:
            ValueError: an unknown policy or GPU, or an offload_peer engine without its GPU.
        """
        if gpu is not None:
            get_gpu(gpu)  # an unknown GPU fails here, listing the known ones
        elif engine.preemption_mode == "offload_peer":
            raise ValueError(
                "an offload_peer engine needs gpu= (the GPU it runs on, e.g. 'h100'): its lent "
                "memory is reached over that GPU's own NVLink"
            )
        self.gpu = gpu
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

    def store(self, config: EngineConfig) -> PeerStore | None:
        """Where a run of `config` saves preempted KV: for offload_peer, a fresh PeerStore of its
        lent capacity over the probe's GPU's NVLink; else None (the engine's own default)."""
        if config.preemption_mode != "offload_peer" or self.gpu is None:
            return None
        return PeerStore(config.peer_capacity_bytes, nvlink(get_gpu(self.gpu).name))

    def _run(self, config: EngineConfig, requests: list[Request]) -> tuple[list[RequestRecord], int]:
        """Records and peak KV bytes used."""
        policy = get_policy(self.policy, **self.policy_options)
        sim = EngineSim(self.cost, config, policy, store=self.store(config))
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
