"""Move a request's KV blocks between vLLM's paged caches and one contiguous buffer.

Save: for every layer, `index_select` the request's blocks along the block dimension into one
slice of a single staging tensor shaped [num_layers, *layer_shape with num_blocks -> n], then move
that tensor in ONE copy to its destination (Aqua's "Aqua tensor": one large transfer instead of
num_layers x n small ones). On a CPU host the gather writes straight into the destination, which
is already host memory, with `index_select` of raw rows (see `_select_rows`). On CUDA the gather
runs on the device into a staging tensor and the one copy goes to pinned DRAM or a peer GPU's
buffer, on a side stream that the compute stream waits for, so a freed block cannot be
overwritten before it has been read.

Load is the reverse: one copy into staging (CUDA) and an `index_copy_` per layer into the blocks
the scheduler allocated (on a CPU host, memmoves of runs of blocks: `_copy_runs`).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

SUB_ROW_BYTES = 16 << 10  # host gather: rows cut to at most this size (`PagedKV._select_rows`)


def _row_split(words: int, word_bytes: int) -> int:
    """Pieces to cut a block row of `words` words into: the smallest power of two (dividing `words`)
    that brings a piece to SUB_ROW_BYTES or less."""
    k = 1
    while words % (2 * k) == 0 and words // k * word_bytes > SUB_ROW_BYTES:
        k *= 2
    return k


class PagedKV:
    """The engine's per-layer paged KV tensors, seen as one [num_layers] x blocks array.

    Args:
        caches: One tensor per layer, all the same shape and dtype, in layer order.
        num_blocks: Number of KV blocks; the block dimension is the first dim of that size.
    """

    def __init__(self, caches: Sequence[torch.Tensor], num_blocks: int) -> None:
        if not caches:
            raise ValueError("no KV cache tensors")
        shape, dtype = caches[0].shape, caches[0].dtype
        for c in caches:
            if c.shape != shape or c.dtype != dtype:
                raise ValueError(f"KV layers differ: {tuple(c.shape)} {c.dtype} vs {tuple(shape)} {dtype}")
        dims = [d for d, size in enumerate(shape) if size == num_blocks]
        if not dims:
            raise ValueError(f"no dimension of {tuple(shape)} has {num_blocks=}")
        self.caches = list(caches)
        self.block_dim = dims[0]
        self.dtype = dtype
        self.device = caches[0].device
        self.num_blocks = num_blocks
        self.layer_block_elems = math.prod(shape) // num_blocks
        self.outer = math.prod(shape[: self.block_dim])
        self.inner = math.prod(shape[self.block_dim + 1 :])
        self.contiguous = all(c.is_contiguous() for c in caches)
        # Host copies move raw words: a same-dtype copy_ of fp16/bf16 is far slower than of int64.
        inner_bytes = self.inner * caches[0].element_size()
        self.word = next(
            w
            for w, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2), (torch.uint8, 1))
            if inner_bytes % size == 0
        )
        self.inner_words = inner_bytes // torch.empty(0, dtype=self.word).element_size()
        self.block_bytes = self.layer_block_elems * caches[0].element_size() * len(self.caches)
        self.split = _row_split(self.inner_words, torch.empty(0, dtype=self.word).element_size())
        self._side: torch.cuda.Stream | None = None
        self._staging: torch.Tensor | None = None
        if self.device.type == "cuda":
            self._side = torch.cuda.Stream(device=self.device)
        # Host gather sources, made once: per layer and outer index, the cache as [rows, sub-row
        # words]. Building these views per save cost more than the copies of a small request.
        self._host_rows: list[torch.Tensor] = []
        if self._side is None and self.contiguous:
            sub = self.inner_words // self.split
            for cache in self.caches:
                rows = cache.view(self.word).view(self.outer, self.num_blocks * self.split, sub)
                self._host_rows.extend(rows.unbind(0))

    def nbytes(self, num_blocks: int) -> int:
        """Bytes of the aggregated buffer holding `num_blocks` blocks of every layer."""
        return num_blocks * self.block_bytes

    def _layer_shape(self, n: int) -> list[int]:
        shape = list(self.caches[0].shape)
        shape[self.block_dim] = n
        return shape

    def as_blocks(self, flat: torch.Tensor, n: int) -> torch.Tensor:
        """View a flat uint8 buffer as [num_layers, *layer shape with n blocks] of the cache dtype."""
        return flat[: self.nbytes(n)].view(self.dtype).view(len(self.caches), *self._layer_shape(n))

    def _staging_for(self, nbytes: int) -> torch.Tensor:
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._staging[:nbytes]

    def gather(self, block_ids: Sequence[int], dest: torch.Tensor) -> None:
        """Copy blocks `block_ids` of every layer into `dest` (flat uint8, >= nbytes(len) bytes)."""
        n = len(block_ids)
        if self._side is None and dest.device == self.device:
            if self.contiguous:
                self._select_rows(block_ids, dest)
                return
            idx = torch.tensor(list(block_ids), dtype=torch.long)
            out = self.as_blocks(dest, n)
            for layer, cache in enumerate(self.caches):
                torch.index_select(cache, self.block_dim, idx, out=out[layer])
            return
        self._gather_cuda(block_ids, dest)

    def scatter(self, block_ids: Sequence[int], src: torch.Tensor, src_blocks: int, first: int = 0) -> None:
        """Copy blocks [first, first + len(block_ids)) of `src` (holding `src_blocks`) into `block_ids`."""
        k = len(block_ids)
        if first < 0 or first + k > src_blocks:
            raise IndexError(f"blocks [{first}, {first + k}) outside a buffer of {src_blocks} blocks")
        if self._side is None and src.device == self.device:
            if self.contiguous:
                self._copy_runs(block_ids, self._rows(src, src_blocks), first)
                return
            idx = torch.tensor(list(block_ids), dtype=torch.long)
            view = self.as_blocks(src, src_blocks)
            for layer, cache in enumerate(self.caches):
                cache.index_copy_(self.block_dim, idx, view[layer].narrow(self.block_dim, first, k))
            return
        self._scatter_cuda(block_ids, src, src_blocks, first)

    def _rows(self, flat: torch.Tensor, n: int) -> torch.Tensor:
        """A buffer of n blocks as [num_layers, outer, n, inner] (outer/inner: dims around blocks)."""
        return flat[: self.nbytes(n)].view(self.word).view(len(self.caches), self.outer, n, self.inner_words)

    def _select_rows(self, block_ids: Sequence[int], dest: torch.Tensor) -> None:
        """Host gather: one `index_select` per layer and outer index, of raw words, each block's row
        cut into `self.split` sub-rows of at most SUB_ROW_BYTES.

        index_select along dim 0 of a 2-D tensor copies whole rows and spreads them over torch's
        intra-op threads, like `copy_`; in the cache's own dtype and shape it runs element by element
        instead. Cutting rows smaller gives the threads more, evener pieces. Measured on the 2-core
        development machine (16 layers x 32 scattered 128 KB blocks, against `copy_` of the same
        64 MB, in a loop of index_selects alone): per-block memmoves 0.38-0.46 of copy_'s bandwidth
        (they run on one thread), whole rows 0.71-0.90, 16 KB sub-rows 0.91-0.98; with one torch
        thread (the engine's worker process), 0.77 / 0.88 of a one-thread copy_. This method as a
        whole, timed alternately with copy_ as benchmarks/aqua_burst.py does, gave 0.62-0.9.

        Per call it builds one index tensor and one view of `dest`; the source views are made once
        (`_host_rows`). For a small request (the test model's 448 KB, 4 index_selects) those fixed
        costs are most of a save: rebuilding the views and a sub-row index on every call made a
        save 2-3x slower.
        """
        n = len(block_ids)
        if n and (min(block_ids) < 0 or max(block_ids) >= self.num_blocks):
            bad = next(b for b in block_ids if not 0 <= b < self.num_blocks)
            raise IndexError(f"block id {bad} outside a cache of {self.num_blocks} blocks")
        k = self.split
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        idx = ids if k == 1 else (ids[:, None] * k + torch.arange(k)).reshape(-1)
        out = dest[: self.nbytes(n)].view(self.word).view(len(self._host_rows), n * k, self.inner_words // k)
        for rows, o in zip(self._host_rows, out.unbind(0), strict=True):
            torch.index_select(rows, 0, idx, out=o)

    def _copy_runs(self, block_ids: Sequence[int], buf: torch.Tensor, first: int) -> None:
        """Host scatter: one memmove per run of consecutive block ids, per layer and outer index.

        Each block's bytes are contiguous inside a layer (for every index of the dims before the
        block dim), so this is a handful of large memmoves rather than an element-wise scatter. The
        moves go through `ctypes.memmove` on the tensors' addresses: a `copy_` per run costs tens of
        microseconds of dispatch, and `index_copy_` of raw rows (the mirror of the gather's
        index_select) runs on one thread and measured no faster (0.55 of copy_'s bandwidth, against
        0.45-0.55 here).
        Bounds: `buf` is a [num_layers, outer, n, inner] view of at least n blocks and every
        block id is checked against the cache, so no move leaves either tensor.
        """
        n = buf.shape[2]
        runs: list[tuple[int, int, int]] = []  # (position in buffer, first block id, length)
        for j, b in enumerate(block_ids):
            if not 0 <= b < self.num_blocks:
                raise IndexError(f"block id {b} outside a cache of {self.num_blocks} blocks")
            if runs and runs[-1][1] + runs[-1][2] == b and runs[-1][0] + runs[-1][2] == first + j:
                pos, start, length = runs[-1]
                runs[-1] = (pos, start, length + 1)
            else:
                runs.append((first + j, b, 1))
        if runs and runs[-1][0] + runs[-1][2] > n:
            raise IndexError(f"blocks up to {runs[-1][0] + runs[-1][2]} outside a buffer of {n} blocks")
        row = self.inner_words * buf.element_size()  # bytes of one block per outer index
        base = buf.data_ptr()
        for layer, cache in enumerate(self.caches):
            for o in range(self.outer):
                cache_at = cache.data_ptr() + o * self.num_blocks * row
                buf_at = base + (layer * self.outer + o) * n * row
                for pos, start, length in runs:
                    ctypes.memmove(cache_at + start * row, buf_at + pos * row, length * row)

    def synchronize(self) -> None:
        """Wait for the side stream (before a source buffer is released)."""
        if self._side is not None:
            self._side.synchronize()

    def _gather_cuda(self, block_ids: Sequence[int], dest: torch.Tensor) -> None:
        assert self._side is not None
        n = len(block_ids)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
            staging = self._staging_for(self.nbytes(n))
            out = self.as_blocks(staging, n)
            for layer, cache in enumerate(self.caches):
                torch.index_select(cache, self.block_dim, idx, out=out[layer])
            # The one aggregated transfer: to pinned DRAM or a peer GPU's lent buffer.
            dest[: staging.numel()].copy_(staging, non_blocking=True)
        # The forward pass must not overwrite the freed blocks before they have been read.
        torch.cuda.current_stream(self.device).wait_stream(side)

    def _scatter_cuda(self, block_ids: Sequence[int], src: torch.Tensor, src_blocks: int, first: int) -> None:
        assert self._side is not None
        k = len(block_ids)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
            staging = self._staging_for(self.nbytes(src_blocks))
            # One aggregated transfer in (the buffer is layer-major, so it is copied whole).
            staging.copy_(src[: self.nbytes(src_blocks)], non_blocking=True)
            view = self.as_blocks(staging, src_blocks)
            for layer, cache in enumerate(self.caches):
                cache.index_copy_(self.block_dim, idx, view[layer].narrow(self.block_dim, first, k))
        torch.cuda.current_stream(self.device).wait_stream(side)
