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
