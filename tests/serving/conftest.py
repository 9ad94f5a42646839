"""Shared helpers for serving-core tests: small workloads, cost models and engines."""

from __future__ import annotations

import random

from serving.costmodel.model import CostModel, PhaseCoeffs
from serving.costmodel.transfer import nvlink
from serving.policies import SchedulingPolicy, get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.preemption import PeerStore
from serving.workload.request import Request


def make_cost(
    prefill: tuple[float, float, float] = (0.010, 1e-4, 0.0),
    decode: tuple[float, float, float] = (0.008, 1e-6, 1e-4),
    kv_bytes_per_token: int = 131072,
) -> CostModel:
    """A cost model with round, readable coefficients (defaults roughly an 8B model on one GPU)."""
    return CostModel(PhaseCoeffs(*prefill), PhaseCoeffs(*decode), kv_bytes_per_token, name="test")


def constant_cost(seconds: float, kv_bytes_per_token: int = 1024) -> CostModel:
    """Every iteration costs exactly `seconds`, whatever its batch (for closed-form queueing tests)."""
    return CostModel(
        PhaseCoeffs(seconds, 0.0, 0.0), PhaseCoeffs(seconds, 0.0, 0.0), kv_bytes_per_token, name="const"
    )


def make_requests(
    n: int,
    rate: float = 10.0,
    prompt: tuple[int, int] = (16, 512),
    output: tuple[int, int] = (1, 256),
    seed: int = 0,
) -> list[Request]:
    """`n` Poisson arrivals at `rate` per second, lengths uniform in the given inclusive ranges."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(Request(i, t, rng.randint(*prompt), rng.randint(*output)))
    return out


def peer_store(config: EngineConfig, gpu: str = "h100") -> PeerStore | None:
    """The lent memory of an offload_peer engine on `gpu` (over its NVLink); None for other modes."""
    if config.preemption_mode != "offload_peer":
        return None
    return PeerStore(config.peer_capacity_bytes, nvlink(gpu))


def make_engine(
    policy: str | SchedulingPolicy = "fcfs",
    cost: CostModel | None = None,
    **config: object,
) -> EngineSim:
    """An engine with the test cost model and an EngineConfig built from `config` overrides (an
    offload_peer one lends over an H100's NVLink 4)."""
    pol = get_policy(policy) if isinstance(policy, str) else policy
    conf = EngineConfig(**config)  # type: ignore[arg-type]
    return EngineSim(cost or make_cost(), conf, pol, store=peer_store(conf))
