"""Host-DRAM KV store (pinned on CUDA hosts so device<->host copies run asynchronously)."""

from __future__ import annotations

import torch

from serving.aqua.offload.store import KVStore


class DramStore(KVStore):
    """Buffers in host memory, bounded by `capacity_bytes`.

    Args:
        capacity_bytes: Upper bound on the bytes held at once; `reserve` beyond it returns None.
        pin: Page-lock buffers; defaults to whether CUDA is available.
    """

    tier = "dram"

    def __init__(self, capacity_bytes: int, pin: bool | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"{capacity_bytes=} must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._bufs: dict[str, torch.Tensor] = {}
        self.used_bytes = 0

    def reserve(self, key: str, nbytes: int) -> torch.Tensor | None:
        self.discard(key)
        if self.used_bytes + nbytes > self.capacity_bytes:
            return None
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        self._bufs[key] = buf
        self.used_bytes += nbytes
        return buf

    def put(self, key: str, data: torch.Tensor) -> bool:
        """Copy `data` (any dtype, contiguous) in under `key`; False when there is no room."""
        src = data.contiguous().view(-1).view(torch.uint8)
        buf = self.reserve(key, src.numel())
        if buf is None:
            return False
        buf.copy_(src)
        return True

    def get(self, key: str) -> torch.Tensor | None:
        return self._bufs.get(key)

    def discard(self, key: str) -> None:
        buf = self._bufs.pop(key, None)
        if buf is not None:
            self.used_bytes -= buf.numel()

    def keys(self) -> list[str]:
        return sorted(self._bufs)
