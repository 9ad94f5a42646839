"""The connector's planner (scheduler side) and worker (engine side) without an engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from serving.aqua.offload.dram import DramStore
from serving.aqua.offload.paged import PagedKV
from serving.aqua.offload.stats import read_json
from serving.vllm_ext.connector import AquaConnector
from serving.vllm_ext.offload_config import OffloadConfig
from serving.vllm_ext.offload_meta import AquaConnectorMetadata, AquaWorkerMetadata, LoadJob, SaveJob
from serving.vllm_ext.offload_planner import OffloadPlanner
from serving.vllm_ext.offload_worker import OffloadWorker

BS = 32


def step(
    planner: OffloadPlanner,
    scheduled: dict[str, tuple[int, int, list[int]]],
    preempted: set[str],
    cached: dict[str, tuple[int, int, list[int] | None]] | None = None,
    resumed: set[str] = frozenset(),  # type: ignore[assignment]
) -> Any:
    """One scheduler step, as vLLM reports it: scheduled = new requests {req_id: (computed_before,
    n_scheduled, block_ids)}; cached = running/resumed ones {req_id: (computed_before, n_scheduled,
    new block ids or None)}, whose new block ids replace the table for `resumed` requests."""
    cached = cached or {}
    so = SimpleNamespace(
        preempted_req_ids=preempted,
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, num_computed_tokens=c, block_ids=(b,))
            for r, (c, _, b) in scheduled.items()
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(cached),
            resumed_req_ids=set(resumed),
            new_block_ids=[None if b is None else (b,) for _, _, b in cached.values()],
            num_computed_tokens=[c for c, _, _ in cached.values()],
        ),
        num_scheduled_tokens={r: n for r, (_, n, _) in {**scheduled, **cached}.items()},
    )
    return planner.build_connector_meta(so)  # type: ignore[arg-type]


def req(req_id: str, num_tokens: int, skip_reading_prefix_cache: bool = False) -> Any:
    return SimpleNamespace(
        request_id=req_id, num_tokens=num_tokens, skip_reading_prefix_cache=skip_reading_prefix_cache
    )


def test_planner_saves_a_preempted_request_and_restores_all_but_the_last_token() -> None:
    p = OffloadPlanner(BS)
    step(p, {"a": (0, 70, [4, 9, 2])}, set())  # 70 tokens of KV in 3 blocks
    meta = step(p, {}, {"a"})
    assert meta.saves == [SaveJob("a", [4, 9, 2], 70)]
    # Re-admitted with one more (sampled) token: 70 restorable, the 71st is computed.
    assert p.get_num_new_matched_tokens(req("a", 71), 0) == (70, False)
    blocks = SimpleNamespace(get_block_ids=lambda: ([7, 8, 1],))
    p.update_state_after_alloc(req("a", 71), blocks, 70)  # type: ignore[arg-type]
    meta = step(p, {"a": (70, 1, [7, 8, 1])}, set())
    assert meta.loads == [LoadJob("a", [7, 8, 1], 0, 3)]
    # Running again; a second preemption saves the new extent from its new blocks.
    assert step(p, {}, {"a"}).saves == [SaveJob("a", [7, 8, 1], 71)]


def test_planner_follows_appended_and_replaced_block_tables_of_running_requests() -> None:
    p = OffloadPlanner(BS)
    step(p, {"a": (0, 30, [4])}, set())
    step(p, {}, set(), cached={"a": (30, 1, None)})  # decode inside block 4
    step(p, {}, set(), cached={"a": (31, 2, [9])})  # crosses into a new block
    assert step(p, {}, {"a"}).saves == [SaveJob("a", [4, 9], 33)]
    # Resumed (recomputed, no offload left): its new table replaces the old one.
    p.update_connector_output(AquaWorkerMetadata(lost={"a"}))
    step(p, {}, set(), cached={"a": (0, 33, [2, 6])}, resumed={"a"})
    step(p, {}, set(), cached={"a": (33, 1, None)})
    assert step(p, {}, {"a"}).saves == [SaveJob("a", [2, 6], 34)]
    # A running request whose table was never seen from its start is not saved.
    step(p, {}, set(), cached={"b": (40, 1, [7])})
    assert step(p, {}, {"b"}).saves == []


def test_planner_loads_only_beyond_a_local_prefix_hit() -> None:
    p = OffloadPlanner(BS)
    step(p, {"a": (0, 100, [1, 2, 3, 4])}, set())
    step(p, {}, {"a"})
    assert p.get_num_new_matched_tokens(req("a", 101), 64) == (36, False)
    p.update_state_after_alloc(req("a", 101), SimpleNamespace(get_block_ids=lambda: ([5, 6, 7, 8],)), 36)  # type: ignore[arg-type]
    assert step(p, {}, set()).loads == [LoadJob("a", [7, 8], 2, 4)]


@pytest.mark.parametrize(("invalid", "saved"), [({8}, [SaveJob("a", [7], 32)]), ({7, 8, 1}, [])])
def test_planner_saves_only_the_valid_prefix_of_a_request_whose_load_failed(
    invalid: set[int], saved: list[SaveJob]
) -> None:
    p = OffloadPlanner(BS)
    step(p, {"a": (0, 70, [4, 9, 2])}, set())
    step(p, {}, {"a"})
    assert p.get_num_new_matched_tokens(req("a", 71), 0) == (70, False)
    p.update_state_after_alloc(req("a", 71), SimpleNamespace(get_block_ids=lambda: ([7, 8, 1],)), 70)  # type: ignore[arg-type]
    assert step(p, {}, set(), cached={"a": (70, 1, [7, 8, 1])}, resumed={"a"}).loads != []
    # The load could not fill `invalid` (its buffer was gone): vLLM truncates the request to the
    # tokens before the first such block and recomputes the rest; preempted before it runs again,
    # only that prefix holds valid KV.
    connector = AquaConnector.__new__(AquaConnector)  # its scheduler side: the planner alone
    connector._planner = p
    output: Any = SimpleNamespace(kv_connector_worker_meta=None, invalid_block_ids=invalid)
    connector.update_connector_output(output)
    assert step(p, {}, {"a"}).saves == saved
    assert p.get_num_new_matched_tokens(req("a", 71), 0) == ((32, False) if saved else (0, False))


def test_planner_forgets_lost_offloads_and_drops_finished_ones() -> None:
    p = OffloadPlanner(BS)
    step(p, {"a": (0, 40, [1, 2]), "b": (0, 40, [3, 4])}, set())
    step(p, {}, {"a", "b"})
    p.update_connector_output(AquaWorkerMetadata(lost={"a"}))
    assert p.get_num_new_matched_tokens(req("a", 41), 0) == (0, False)
    p.request_finished("b")
    assert step(p, {}, set()).drops == ["b"]


def test_planner_never_saves_a_request_that_vllm_would_not_load() -> None:
    # A request with prompt logprobs skips every cache (vLLM's skip_reading_prefix_cache): its KV
    # would be copied out on each preemption and never read back.
    p = OffloadPlanner(BS)
    assert p.get_num_new_matched_tokens(req("a", 40, skip_reading_prefix_cache=True), 0) == (0, False)
    assert p.get_num_new_matched_tokens(req("b", 40), 0) == (0, False)
    step(p, {"a": (0, 40, [1, 2]), "b": (0, 40, [3, 4])}, set())
    assert step(p, {}, {"a", "b"}).saves == [SaveJob("b", [3, 4], 40)]
    assert p.get_num_new_matched_tokens(req("a", 41, skip_reading_prefix_cache=True), 0) == (0, False)
    p.request_finished("a")
    assert step(p, {}, set()).drops == []  # nothing was held for it


def test_planner_frees_a_buffer_that_vllm_declines_to_load() -> None:
    # vLLM admits a request without the offered load when it skips every cache (prompt logprobs):
    # it recomputes, and the buffer must not stay held while it runs (until it finishes).
    p = OffloadPlanner(BS)
    step(p, {"a": (0, 40, [1, 2])}, set())
    step(p, {}, {"a"})
    assert p.get_num_new_matched_tokens(req("a", 41), 0) == (40, False)
    p.update_state_after_alloc(req("a", 41), SimpleNamespace(get_block_ids=lambda: ([5, 6],)), 0)  # type: ignore[arg-type]
    meta = step(p, {}, set(), cached={"a": (0, 41, [5, 6])}, resumed={"a"})
    assert meta.loads == [] and meta.drops == ["a"]
    p.request_finished("a")  # nothing left to free
    assert step(p, {}, set()).drops == []


def make_worker(tmp_path: Path, dram_bytes: int = 1 << 20) -> tuple[OffloadWorker, list[torch.Tensor]]:
    caches = [torch.randn(8, 2, 2, BS, 64) for _ in range(2)]
    w = OffloadWorker(OffloadConfig(stats_dir=str(tmp_path)), [DramStore(dram_bytes, pin=False)])
    w.register(PagedKV(caches, 8))
    return w, caches


def test_worker_restores_exact_blocks_and_counts_bytes(tmp_path: Path) -> None:
    w, caches = make_worker(tmp_path)
    want = [c[[3, 5]].clone() for c in caches]
    w.run_saves(AquaConnectorMetadata(saves=[SaveJob("a", [3, 5], 50)]))
    for c in caches:
        c[[3, 5]] = 0.0  # freed blocks get reused
    w.run_loads(AquaConnectorMetadata(loads=[LoadJob("a", [0, 6], 0, 2)]))
    assert all(torch.equal(c[[0, 6]], x) for c, x in zip(caches, want, strict=True))
    stats = read_json(tmp_path / "offload-worker.json", settle_s=0.3)
    assert stats["bytes_offloaded"] == stats["bytes_restored"] == 2 * 2 * 2 * 2 * BS * 64 * 4
    assert stats["held"] == {"dram": 0}  # the buffer is released once restored


def test_worker_reports_a_missing_load_as_invalid_blocks_and_writes_nothing(tmp_path: Path) -> None:
    w, caches = make_worker(tmp_path, dram_bytes=1024)  # no room: the save is lost
    w.run_saves(AquaConnectorMetadata(saves=[SaveJob("a", [3, 5], 50)]))
    meta = w.take_worker_meta()
    assert meta is not None and meta.lost == {"a"}
    before = [c.clone() for c in caches]
    w.run_loads(AquaConnectorMetadata(loads=[LoadJob("a", [0, 6], 0, 2)]))
    assert w.take_invalid_blocks() == {0, 6}
    assert all(torch.equal(c, b) for c, b in zip(caches, before, strict=True))


def test_config_rejects_unknown_options() -> None:
    with pytest.raises(ValueError, match="unknown AquaConnector options"):
        OffloadConfig.from_extra({"dram_byte": 1})
