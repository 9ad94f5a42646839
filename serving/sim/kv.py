"""Paged KV-cache accounting: fixed-size blocks, a capacity, all-or-nothing allocation.

Only counts are kept (which block holds what does not change any latency): a request holds
`ceil(tokens / block_size)` blocks for the tokens whose KV it has (or is about to compute).
The engine reads and writes `free` directly on its hot path; these methods are the readable form.
"""

from __future__ import annotations


class KVCache:
    """Block counts of one engine's KV cache.

    Attributes:
        block_size: Tokens per block.
        total: Capacity in blocks (may grow when a lender reclaims memory it had lent).
        free: Blocks no request holds.
    """

    __slots__ = ("block_size", "free", "total")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"{num_blocks=} must be positive")
        if block_size < 1:
            raise ValueError(f"{block_size=} must be positive")
        self.block_size = block_size
        self.total = num_blocks
        self.free = num_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    def try_allocate(self, held: int, tokens: int) -> int:
        """Grow a holding of `held` blocks to cover `tokens`; returns the new holding, or -1 if short."""
        need = -(-tokens // self.block_size) - held
        if need > self.free:
            return -1
        if need > 0:
            self.free -= need
            return held + need
        return held

    def release(self, held: int) -> None:
        """Return `held` blocks to the pool."""
        self.free += held

    def grow(self, blocks: int) -> None:
        """Add capacity (e.g. memory a lender took back from its borrower)."""
        if blocks < 0:
            raise ValueError(f"{blocks=} must be >= 0")
        self.total += blocks
        self.free += blocks

    @property
    def used(self) -> int:
        return self.total - self.free
