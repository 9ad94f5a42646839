"""Preemption costs follow the cost model: recompute pays a prefill, offload pays the link.

Scenario (block_size 4, 6 KV blocks, two requests of 8 prompt + 8 output tokens arriving together):
both prefill in one iteration and decode until their sequences reach 13 tokens, when each needs a
4th block and only 0 are free. A is first in FCFS service order, so B (admitted last) is preempted
with 12 computed tokens in 3 blocks. B can come back only once A has finished.
"""

from __future__ import annotations

import pytest

from serving.costmodel.transfer import NVLINK3, NVLINK4, PCIE5_X16, nvlink
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.preemption import DramStore, PeerStore
from serving.workload.request import Request
from tests.serving.conftest import make_cost, make_engine

KVB = 4096  # KV bytes per token
COST = make_cost(prefill=(0.010, 1e-4, 0.0), decode=(0.005, 1e-5, 1e-4), kv_bytes_per_token=KVB)
SAVED_BYTES = 3 * 4 * KVB  # B's 3 blocks of 4 tokens


def run(mode: str, peer: int = 0) -> tuple[EngineSim, RequestRecord, RequestRecord]:
    engine = make_engine(
        cost=COST, block_size=4, num_kv_blocks=6, preemption_mode=mode, peer_capacity_bytes=peer
    )
    a, b = engine.run([Request(0, 0.0, 8, 8), Request(1, 0.0, 8, 8)])
    assert a.finished and b.finished and engine.stats.preemptions == 1
    return engine, a, b


def test_it_preempts_the_last_admitted_and_recomputes_prompt_and_output() -> None:
    _, a, b = run("recompute")
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert b.recomputed_tokens == 12 and b.bytes_moved == 0
    assert len(b.token_times) == 8
    # A's decode at the preemption costs a plain decode: recompute moves nothing.
    assert a.token_times[5] - a.token_times[4] == pytest.approx(COST.decode_time([13]))
    # B's 6th token comes from prefilling its 8 prompt + 5 generated tokens again, alone, after A.
    assert b.token_times[5] - a.token_times[-1] == pytest.approx(COST.prefill_time([13]))


@pytest.mark.parametrize(
    ("mode", "link", "peer"), [("offload_dram", PCIE5_X16, 0), ("offload_peer", NVLINK4, 1 << 30)]
)
def test_it_charges_offload_save_and_restore_at_link_cost(mode: str, link: object, peer: int) -> None:
    engine, a, b = run(mode, peer)
    seconds = link.seconds(SAVED_BYTES)  # type: ignore[attr-defined]
    assert seconds > 0
    assert b.recomputed_tokens == 0 and b.bytes_moved == 2 * SAVED_BYTES
    # The save is added to the iteration in which B is preempted (A's decode at 13 tokens) ...
    assert a.token_times[5] - a.token_times[4] == pytest.approx(COST.decode_time([13]) + seconds)
    # ... and the restore to the iteration that re-admits B, which then simply decodes.
    assert b.token_times[5] - a.token_times[-1] == pytest.approx(COST.decode_time([13]) + seconds)
    assert engine.stats.transfer_seconds == pytest.approx(2 * seconds)


def test_it_falls_back_to_dram_when_lent_memory_is_too_small() -> None:
    _, a, b = run("offload_peer", peer=SAVED_BYTES - 1)
    seconds = PCIE5_X16.seconds(SAVED_BYTES)
    assert a.token_times[5] - a.token_times[4] == pytest.approx(COST.decode_time([13]) + seconds)
    assert b.token_times[5] - a.token_times[-1] == pytest.approx(COST.decode_time([13]) + seconds)


def test_offload_beats_recompute_when_the_link_is_fast() -> None:
    _, _, b_rec = run("recompute")
    _, _, b_peer = run("offload_peer", 1 << 30)
    assert b_peer.token_times[-1] < b_rec.token_times[-1]


@pytest.mark.parametrize("store", [None, DramStore()])
def test_an_offload_peer_engine_without_a_peer_store_is_refused(store: DramStore | None) -> None:
    # EngineSim built its own PeerStore over NVLink 4 when given none, whatever the GPU: an A100
    # engine's lent memory was priced at 450 GB/s instead of its NVLink 3's 300. Only the caller
    # knows the GPU, so the store (over costmodel.nvlink(gpu)) is now required.
    config = EngineConfig(num_kv_blocks=6, preemption_mode="offload_peer", peer_capacity_bytes=1 << 30)
    with pytest.raises(
        ValueError, match=r"offload_peer.*needs store=PeerStore\(capacity, costmodel.nvlink\(gpu\)\)"
    ):
        EngineSim(COST, config, get_policy("fcfs"), store=store)


def test_an_a100_engine_offloads_to_lent_memory_over_nvlink_3() -> None:
    config = EngineConfig(
        block_size=4, num_kv_blocks=6, preemption_mode="offload_peer", peer_capacity_bytes=1 << 30
    )
    engine = EngineSim(COST, config, get_policy("fcfs"), store=PeerStore(1 << 30, nvlink("a100")))
    a, _ = engine.run([Request(0, 0.0, 8, 8), Request(1, 0.0, 8, 8)])
    seconds = NVLINK3.seconds(SAVED_BYTES)
    assert a.token_times[5] - a.token_times[4] == pytest.approx(COST.decode_time([13]) + seconds)
    assert engine.stats.transfer_seconds == pytest.approx(2 * seconds)
