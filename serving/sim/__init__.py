"""Discrete-event simulation of vLLM-like engines and of GPU servers running them.

    EngineSim     one engine: continuous batching, chunked prefill, paged KV, preemption modes
    EngineConfig  its limits (vLLM's max_num_batched_tokens, max_num_seqs, block_size, ...)
    ClusterSim    servers of GPUs, one engine per GPU or TP group, memory lending and reclaim

`python -m serving.sim --help` runs one engine on a generated workload (serving/sim/cli.py).
"""

from serving.sim.cluster import ClusterResult, ClusterSim, EngineSpec, Lending, tp_cost
from serving.sim.config import PREEMPTION_MODES, EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.events import KV_GROW, PEER_CAPACITY, EngineStats, TimedChange

__all__ = [
    "KV_GROW",
    "PEER_CAPACITY",
    "PREEMPTION_MODES",
    "ClusterResult",
    "ClusterSim",
    "EngineConfig",
    "EngineSim",
    "EngineSpec",
    "EngineStats",
    "Lending",
    "TimedChange",
    "tp_cost",
]
