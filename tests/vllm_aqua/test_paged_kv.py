"""PagedKV gather/scatter and the DRAM store (no engine)."""

from __future__ import annotations

import pytest
import torch

from serving.aqua.offload.dram import DramStore
from serving.aqua.offload.paged import PagedKV


# Rows of 32 KB (gathered as two 16 KB sub-rows), the block dim second, and 84-byte rows of an odd
# number of words (not cut).
@pytest.mark.parametrize("shape", [(12, 2, 2, 32, 64), (2, 12, 2, 32, 64), (12, 3, 7)])
def test_it_gathers_blocks_into_one_buffer_and_scatters_them_back(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    caches = [torch.randn(shape) for _ in range(3)]
    kv = PagedKV(caches, 12)
    ids = [7, 2, 3, 11]
    buf = torch.empty(kv.nbytes(len(ids)), dtype=torch.uint8)
    kv.gather(ids, buf)
    view = kv.as_blocks(buf, len(ids))
    for layer in range(3):
        assert torch.equal(view[layer], caches[layer].index_select(kv.block_dim, torch.tensor(ids)))
    before = [c.clone() for c in caches]
    # Restore blocks 1..3 of the buffer (a partial load) into three other blocks.
    dst = [0, 5, 9]
    kv.scatter(dst, buf, len(ids), first=1)
    for layer in range(3):
        got = caches[layer].index_select(kv.block_dim, torch.tensor(dst))
        assert torch.equal(got, before[layer].index_select(kv.block_dim, torch.tensor(ids[1:])))
        untouched = [b for b in range(12) if b not in dst]
        idx = torch.tensor(untouched)
        assert torch.equal(
            caches[layer].index_select(kv.block_dim, idx), before[layer].index_select(kv.block_dim, idx)
        )


def test_a_save_of_no_blocks_copies_nothing() -> None:
    kv = PagedKV([torch.zeros(4, 2, 32, 64)], 4)
    kv.gather([], torch.empty(0, dtype=torch.uint8))  # must not raise


def test_it_rejects_a_block_id_outside_the_cache() -> None:
    kv = PagedKV([torch.zeros(4, 2, 32, 64)], 4)
    buf = torch.empty(kv.nbytes(2), dtype=torch.uint8)
    with pytest.raises(IndexError, match="block id 4"):
        kv.gather([0, 4], buf)


def test_it_rejects_a_restore_outside_the_saved_buffer() -> None:
    kv = PagedKV([torch.zeros(4, 2, 32, 64)], 4)
    buf = torch.empty(kv.nbytes(2), dtype=torch.uint8)
    with pytest.raises(IndexError):
        kv.scatter([0, 1], buf, 2, first=1)


def test_dram_store_is_all_or_nothing_within_capacity() -> None:
    store = DramStore(capacity_bytes=100, pin=False)
    a = store.reserve("a", 60)
    assert a is not None and a.numel() == 60
    assert store.reserve("b", 60) is None
    assert store.keys() == ["a"]
    store.discard("a")
    assert store.get("a") is None and store.used_bytes == 0
    assert store.reserve("b", 100) is not None


def test_it_gathers_what_the_engine_wrote_after_it_was_built() -> None:
    # The host gather's source views are made once; they must see later writes to the caches.
    caches = [torch.zeros(12, 2, 2, 32, 64) for _ in range(2)]
    kv = PagedKV(caches, 12)
    for layer, c in enumerate(caches):
        c[4].fill_(layer + 1.0)
    buf = torch.empty(kv.nbytes(1), dtype=torch.uint8)
    kv.gather([4], buf)
    assert [float(x.unique()) for x in kv.as_blocks(buf, 1)] == [1.0, 2.0]


def test_dram_store_reuses_a_discarded_buffer_for_a_request_of_about_its_size() -> None:
    store = DramStore(capacity_bytes=1000, pin=False)
    a = store.reserve("a", 400)
    assert a is not None
    addr = a.data_ptr()
    store.discard("a")
    b = store.reserve("b", 360)  # within REUSE_SLACK: the same memory, seen at the size asked
    assert b is not None and b.data_ptr() == addr and b.numel() == 360
    assert store.get("b") is not None and store.get("b").numel() == 360  # type: ignore[union-attr]
    assert store.used_bytes == 400  # a reused buffer counts at its full size
    store.discard("b")
    c = store.reserve("c", 100)  # far smaller: a buffer of its own
    assert c is not None and c.data_ptr() != addr and store.used_bytes == 100


def test_dram_store_drops_idle_buffers_to_stay_within_capacity() -> None:
    store = DramStore(capacity_bytes=1000, pin=False)
    for key in ("a", "b"):
        assert store.reserve(key, 400) is not None
    store.discard("a")
    store.discard("b")
    assert (store.used_bytes, store.idle_bytes) == (0, 800)
    big = store.reserve("big", 900)  # no idle buffer fits: both are dropped to make room
    assert big is not None
    assert (store.used_bytes, store.idle_bytes) == (900, 0)
    assert store.reserve("more", 200) is None  # and the bound still holds
