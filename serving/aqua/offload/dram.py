"""Host-DRAM KV store (pinned on CUDA hosts so device<->host copies run asynchronously)."""

from __future__ import annotations

import bisect

import torch

from serving.aqua.offload.store import KVStore, check_nbytes

REUSE_SLACK = 1.25  # an idle buffer is reused for a request of at least 1/REUSE_SLACK its size


class DramStore(KVStore):
    """Buffers in host memory, bounded by `capacity_bytes`.

    A discarded buffer is kept idle and reused for a later request of about its size (at most
    REUSE_SLACK times larger than asked): a fresh host buffer pays a page fault per page on its
    first write. On the 2-core development machine, reserving and filling a 64 MB buffer (the KV
    of ~500 tokens of a Llama-3-8B) took 52-59 ms fresh against 10-12 ms reused; for the test
    model's 448 KB, fresh buffers added 20-30 us to a ~70 us save. Buffers held and idle together
    never exceed `capacity_bytes`; idle ones are dropped, largest first, to make room for a new
    allocation, and all of them on `close`.

    Args:
        capacity_bytes: Upper bound on the bytes held at once (a reused buffer counts at its full
            size); `reserve` beyond it returns None.
        pin: Page-lock buffers; defaults to whether CUDA is available.
    """

    tier = "dram"

    def __init__(self, capacity_bytes: int, pin: bool | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"{capacity_bytes=} must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._bufs: dict[str, torch.Tensor] = {}  # key -> the whole buffer it holds
        self._sizes: dict[str, int] = {}  # key -> bytes asked for (the view `get` returns)
        self._idle_sizes: list[int] = []  # sorted, parallel to _idle
        self._idle: list[torch.Tensor] = []
        self.used_bytes = 0
        self.idle_bytes = 0

    def reserve(self, key: str, nbytes: int) -> torch.Tensor | None:
        check_nbytes(nbytes)
        self.discard(key)
        buf = self._take_idle(nbytes)
        if buf is None:
            if self.used_bytes + nbytes > self.capacity_bytes:
                return None
            self._drop_idle(self.capacity_bytes - self.used_bytes - nbytes)
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        self._bufs[key] = buf
        self._sizes[key] = nbytes
        self.used_bytes += buf.numel()
        return buf[:nbytes]

    def _take_idle(self, nbytes: int) -> torch.Tensor | None:
        """The smallest idle buffer of nbytes..nbytes*REUSE_SLACK that fits the capacity, if any."""
        i = bisect.bisect_left(self._idle_sizes, nbytes)
        if i == len(self._idle_sizes):
            return None
        size = self._idle_sizes[i]
        if size > nbytes * REUSE_SLACK or self.used_bytes + size > self.capacity_bytes:
            return None
        del self._idle_sizes[i]
        self.idle_bytes -= size
        return self._idle.pop(i)

    def _drop_idle(self, room: int) -> None:
        while self._idle and self.idle_bytes > room:
            self.idle_bytes -= self._idle_sizes.pop()
            self._idle.pop()

    def put(self, key: str, data: torch.Tensor) -> bool:
        """Copy `data` (any dtype, contiguous, not empty) in under `key`; False when there is no room."""
        src = data.contiguous().view(-1).view(torch.uint8)
        buf = self.reserve(key, src.numel())
        if buf is None:
            return False
        buf.copy_(src)
        return True

    def get(self, key: str) -> torch.Tensor | None:
        buf = self._bufs.get(key)
        return None if buf is None else buf[: self._sizes[key]]

    def discard(self, key: str) -> None:
        buf = self._bufs.pop(key, None)
        if buf is None:
            return
        del self._sizes[key]
        self.used_bytes -= buf.numel()
        i = bisect.bisect_right(self._idle_sizes, buf.numel())
        self._idle_sizes.insert(i, buf.numel())
        self._idle.insert(i, buf)
        self.idle_bytes += buf.numel()

    def keys(self) -> list[str]:
        return sorted(self._bufs)

    def close(self) -> None:
        super().close()
        self._drop_idle(0)
