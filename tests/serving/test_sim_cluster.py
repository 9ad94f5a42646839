"""Cluster layer: placement checks, routing, tensor parallelism, lending and reclaim."""

from __future__ import annotations

import pytest

from serving.costmodel.transfer import NVLINK3, NVLINK4, PCIE5_X16, Link
from serving.sim.cluster import ClusterSim, EngineSpec, Lending, tp_cost
from serving.sim.config import EngineConfig
from serving.sim.preemption import PeerStore
from serving.workload.request import Request
from tests.serving.conftest import make_cost, make_requests

COST = make_cost(kv_bytes_per_token=8192)
BLOCK_BYTES = 16 * 8192


def spec(name: str, gpus: tuple[int, ...], gpu: str = "h100", **config: object) -> EngineSpec:
    return EngineSpec(name, "s0", gpus, "m", COST, EngineConfig(**config), gpu=gpu)  # type: ignore[arg-type]


def test_it_routes_round_robin_and_runs_every_engine() -> None:
    cluster = ClusterSim({"s0": 4}, [spec(f"g{i}", (i,)) for i in range(4)])
    reqs = make_requests(100, rate=20, seed=1)
    result = cluster.run(reqs)
    assert [len(result.records[f"g{i}"]) for i in range(4)] == [25] * 4
    assert [r.req_id for r in result.records["g1"]] == list(range(1, 100, 4))
    assert all(r.finished for r in result.all_records())


def test_a_tensor_parallel_engine_is_faster_but_keeps_its_fixed_cost() -> None:
    tp4 = tp_cost(COST, 4)
    assert tp4.decode.a == COST.decode.a
    assert tp4.decode.b == pytest.approx(COST.decode.b / (4 * 0.9))
    assert tp4.prefill_time([1000]) < COST.prefill_time([1000])
    cluster = ClusterSim({"s0": 8}, [spec("tp4", (0, 1, 2, 3)), spec("tp1", (4,))])
    reqs = [Request(0, 0.0, 1000, 50)]
    fast = cluster.run(workloads={"m": reqs}).records["tp4"][0]
    slow = ClusterSim({"s0": 8}, [spec("tp1", (4,))]).run(reqs).records["tp1"][0]
    assert fast.token_times[-1] < slow.token_times[-1]


@pytest.mark.parametrize(
    ("servers", "engines", "message"),
    [
        ({"s0": 2}, [spec("a", (0,)), spec("b", (0,))], "already used"),
        ({"s0": 2}, [spec("a", (2,))], "GPU 2 not on 's0'"),
        ({"s1": 2}, [spec("a", (0,))], "unknown server 's0'"),
        ({"s0": 2}, [spec("a", (0,)), spec("a", (1,))], "unique"),
    ],
)
def test_it_rejects_impossible_placements(
    servers: dict[str, int], engines: list[EngineSpec], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterSim(servers, engines)


def test_it_requires_the_borrower_to_offload_to_peer() -> None:
    with pytest.raises(ValueError, match="offload_peer"):
        ClusterSim({"s0": 2}, [spec("a", (0,)), spec("b", (1,))], [Lending("a", "b", 1 << 20)])


@pytest.mark.parametrize(
    ("lender_gpu", "borrower_gpu"), [("h100", "a100"), ("a100", "h100"), ("h200", "h100")]
)
def test_a_lending_between_different_gpu_kinds_is_refused(lender_gpu: str, borrower_gpu: str) -> None:
    # It was accepted, the transfer priced at the borrower's own NVLink: an A100 borrowing from
    # an H100 at NVLink 3, an H100 from an A100 at NVLink 4, a link no such pair has.
    lender = spec("lender", (0,), lender_gpu)
    borrower = spec("borrower", (1,), borrower_gpu, num_kv_blocks=120, preemption_mode="offload_peer")
    message = rf"'lender' \({lender_gpu}\) -> 'borrower' \({borrower_gpu}\) pairs different GPU kinds"
    with pytest.raises(ValueError, match=message):
        ClusterSim({"s0": 2}, [lender, borrower], [Lending("lender", "borrower", 400 * BLOCK_BYTES)])


def test_an_engine_cannot_lend_memory_to_itself() -> None:
    # It was accepted: on a 1-GPU server the engine (120 blocks) "lent" itself 400 blocks of peer
    # space, and the reclaim then grew its cache to 520 blocks, memory its GPU does not have.
    engine = spec("a", (0,), num_kv_blocks=120, preemption_mode="offload_peer")
    with pytest.raises(ValueError, match="'a' cannot lend memory to itself"):
        ClusterSim({"s0": 1}, [engine], [Lending("a", "a", 400 * BLOCK_BYTES, ((2.0, 0),))])


def test_reclaim_moves_borrowed_kv_to_dram_and_the_run_completes() -> None:
    lent = 400 * BLOCK_BYTES
    lender = spec("lender", (0,), num_kv_blocks=1000)
    borrower = spec("borrower", (1,), num_kv_blocks=120, preemption_mode="offload_peer")
    # The borrower is overloaded from t=0, so it keeps KV in lent memory; at t=2s all is reclaimed.
    reqs = [Request(i, 0.01 * i, 200, 300) for i in range(60)]
    cluster = ClusterSim({"s0": 2}, [lender, borrower], [Lending("lender", "borrower", lent, ((2.0, 0),))])
    result = cluster.run(workloads={"m": reqs})
    store = result.engines["borrower"].store
    assert isinstance(store, PeerStore)
    assert store.evacuated_bytes > 0 and store.peer_used_bytes == 0 and store.capacity_bytes == 0
    assert all(r.finished for r in result.all_records())
    # The lender got the reclaimed memory back as KV blocks.
    assert result.engines["lender"].kv.total == 1000 + 400
    # After the reclaim every save goes over PCIe: bytes moved = saves + restores + evacuations.
    borrowed = [r for r in result.records["borrower"] if r.preemptions]
    assert borrowed and sum(r.bytes_moved for r in borrowed) > 0
    assert result.stats["borrower"].transfer_seconds >= PCIE5_X16.seconds(store.evacuated_bytes) * 0.999


def test_reclaims_in_parts_give_the_lender_every_whole_block_back() -> None:
    # 3 blocks lent, reclaimed 1.5 blocks at a time: each reclaim gave 1 block, 2 of the 3 in all.
    borrower = spec("borrower", (1,), num_kv_blocks=120, preemption_mode="offload_peer")
    half = BLOCK_BYTES * 3 // 2
    ln = Lending("lender", "borrower", 3 * BLOCK_BYTES, ((1.0, half), (2.0, 0)))
    cluster = ClusterSim({"s0": 2}, [spec("lender", (0,), num_kv_blocks=100), borrower], [ln])
    result = cluster.run(workloads={"m": [Request(0, 0.0, 10, 5), Request(1, 3.0, 10, 5)]})
    assert result.engines["lender"].kv.total == 100 + 3


def test_without_reclaim_the_borrower_keeps_using_lent_memory() -> None:
    borrower = spec("borrower", (1,), num_kv_blocks=120, preemption_mode="offload_peer")
    reqs = [Request(i, 0.01 * i, 200, 300) for i in range(60)]
    cluster = ClusterSim(
        {"s0": 2}, [spec("lender", (0,)), borrower], [Lending("lender", "borrower", 400 * BLOCK_BYTES)]
    )
    result = cluster.run(workloads={"m": reqs})
    store = result.engines["borrower"].store
    assert isinstance(store, PeerStore) and store.evacuated_bytes == 0
    assert result.stats["borrower"].preemptions > 0


@pytest.mark.parametrize(("gpu", "link"), [("a100", NVLINK3), ("h100", NVLINK4), ("h200", NVLINK4)])
def test_a_borrower_reaches_lent_memory_over_its_gpus_own_nvlink(gpu: str, link: Link) -> None:
    # Every borrower's PeerStore was NVLink 4 (450 GB/s), so an A100's offloads were priced 1.5x
    # too fast; an A100 pair is NVLink 3 (300 GB/s).
    borrower = spec("borrower", (1,), gpu, num_kv_blocks=120, preemption_mode="offload_peer")
    lending = [Lending("lender", "borrower", 400 * BLOCK_BYTES)]
    cluster = ClusterSim({"s0": 2}, [spec("lender", (0,), gpu), borrower], lending)
    result = cluster.run(workloads={"m": [Request(i, 0.01 * i, 200, 300) for i in range(60)]})
    store = result.engines["borrower"].store
    assert isinstance(store, PeerStore) and store.peer_link == link
    assert result.stats["borrower"].transfer_seconds > 0


def test_an_engine_of_an_unknown_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown gpu 'A100'"):
        spec("a", (0,), "A100")
