"""The same `aqua` policy object in the simulator: it cuts the burst's p99 TTFT versus FCFS."""

from __future__ import annotations

from serving.costmodel.model import CostModel, PhaseCoeffs
from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.workload.request import Request


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]


def _burst_ttft(policy: str, mode: str) -> tuple[float, float, int]:
    cost = CostModel(PhaseCoeffs(0.010, 1e-4, 0.0), PhaseCoeffs(0.008, 1e-6, 1e-4), 131072, name="t")
    cfg = EngineConfig(
        max_num_batched_tokens=512, max_num_seqs=8, block_size=16, num_kv_blocks=256, preemption_mode=mode
    )
    longs = [Request(i, 0.0, 64, 1500) for i in range(8)]
    shorts = [Request(8 + i, 2.0 + 0.01 * i, 32, 8) for i in range(16)]
    sim = EngineSim(cost, cfg, get_policy(policy))
    records = sim.run(longs + shorts)
    ttft = [r.ttft for r in records if r.req_id >= 8 and r.ttft is not None]
    makespan = max(r.token_times[-1] for r in records if r.token_times)
    assert len(ttft) == 16
    return _p99(ttft), makespan, sim.stats.preemptions


def test_aqua_cuts_p99_ttft_of_a_burst_behind_long_requests() -> None:
    fcfs_p99, fcfs_span, _ = _burst_ttft("fcfs", "recompute")
    aqua_p99, aqua_span, preemptions = _burst_ttft("aqua", "offload_dram")
    assert preemptions > 0
    assert aqua_p99 * 10 < fcfs_p99, (aqua_p99, fcfs_p99)
    # Fairness costs little total time when the rotated KV is swapped, not recomputed.
    assert aqua_span < 1.10 * fcfs_span, (aqua_span, fcfs_span)
