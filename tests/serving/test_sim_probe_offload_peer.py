"""A SimulatorProbe of an offload_peer engine (preempted KV saved into memory a paired GPU lends
over NVLink) is told the GPU it runs on, as a simulated host's engines are, and reaches the lent
memory over that GPU's own NVLink. The probe built its engine without a store, so profiling such an
engine failed at the first probe ("preemption_mode='offload_peer' needs store=PeerStore(...)")."""

from __future__ import annotations

import pytest

from serving.costmodel import get_preset, kv_capacity_tokens
from serving.costmodel.transfer import NVLINK3, NVLINK4
from serving.profiler import LatencySLA, ProfilerConfig, SimulatorProbe, WorkloadSpec, profile_model
from serving.sim.config import EngineConfig

COST = get_preset("llama-3-8b", "a100")
WORKLOAD = WorkloadSpec(num_requests=150, burst_duration_s=2.0, seed=3)
# a cache small enough that 8 req/s preempts: 7.7 GB of KV go to the lent memory
OFFLOAD_PEER = EngineConfig(
    num_kv_blocks=kv_capacity_tokens("llama-3-8b", "h100") // 16 // 50,
    preemption_mode="offload_peer",
    peer_capacity_bytes=8 << 30,
)


def test_an_offload_peer_engine_is_profiled_over_its_gpus_own_nvlink() -> None:
    probe = SimulatorProbe(COST, OFFLOAD_PEER, WORKLOAD, gpu="a100")
    profile = profile_model("m", probe, LatencySLA(0.2, 0.05), WORKLOAD, ProfilerConfig(burst_levels=(2.0,)))
    assert profile.max_rps > 1.0 and profile.role == "consumer"

    store = probe.store(OFFLOAD_PEER)
    assert store is not None and store.peer_link == NVLINK3 and store.capacity_bytes == 8 << 30
    on_h100 = SimulatorProbe(COST, OFFLOAD_PEER, WORKLOAD, gpu="h100")
    assert (h100_store := on_h100.store(OFFLOAD_PEER)) is not None and h100_store.peer_link == NVLINK4
    # the same offloads take longer over an A100's NVLink 3 than over an H100's NVLink 4
    a100_records, _ = probe._run(OFFLOAD_PEER, WORKLOAD.requests(8.0))
    h100_records, _ = on_h100._run(OFFLOAD_PEER, WORKLOAD.requests(8.0))
    assert sum(r.bytes_moved for r in a100_records) > 0
    assert all(r.finished for r in a100_records + h100_records)
    assert sum(r.token_times[-1] for r in a100_records) > sum(r.token_times[-1] for r in h100_records)


def test_an_offload_peer_engine_without_its_gpu_or_with_an_unknown_one_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match=r"an offload_peer engine needs gpu= \(the GPU it runs on"):
        SimulatorProbe(COST, OFFLOAD_PEER, WORKLOAD)
    with pytest.raises(ValueError, match="v100"):
        SimulatorProbe(COST, OFFLOAD_PEER, WORKLOAD, gpu="v100")
    # the other modes need no GPU (their KV is dropped, or goes to host DRAM over PCIe)
    dram = EngineConfig(num_kv_blocks=OFFLOAD_PEER.num_kv_blocks, preemption_mode="offload_dram")
    assert SimulatorProbe(COST, dram, WORKLOAD).measure(2.0).finished > 0
