"""The `Region` interface: a block of memory that KV data is copied into and out of.

Primitives: `handle()` (how another process attaches), `view(offset, nbytes)` (a zero-copy
memoryview, host memory only), `tensor(offset, nbytes)` (a zero-copy uint8 torch view, host or
device), `write(offset, data)`, `read_into(offset, out)` and `close()`.

Bounds are checked on every access: nothing outside [0, nbytes) is ever touched.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


class RegionUnavailable(RuntimeError):
    """A handle cannot be opened here: the memory is gone, private to another process, or needs a
    device this process does not have. The consumer falls back (DRAM or recompute)."""


# What `write` accepts / `read_into` fills: anything exposing a contiguous buffer, or a torch tensor.
Buffer = bytes | bytearray | memoryview | Any


class Region(ABC):
    """A block of `nbytes` bytes on `device`, created by its owner or attached through a handle."""

    kind: ClassVar[str]

    def __init__(self, nbytes: int, device: str, *, owner: bool) -> None:
        if nbytes <= 0:
            raise ValueError(f"{nbytes=} must be positive")
        self.nbytes = nbytes
        self.device = device
        self.owner = owner
        self.closed = False

    @abstractmethod
    def handle(self) -> dict[str, Any]:
        """A JSON-able dict another process passes to `open_region` to attach this memory.

        Called by the producer when it leases the region. Returns {"kind": <kind>, ...}.
        """

    @abstractmethod
    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 torch tensor aliasing bytes [offset, offset + nbytes); writes go to the region."""

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable memoryview of bytes [offset, offset + nbytes) (host memory only).

        Release it (`mv.release()` or drop it) before `close()`.
        """
        raise TypeError(f"{type(self).__name__} is not host memory; use tensor() or write()/read_into()")

    def write(self, offset: int, data: Buffer) -> None:
        """Copy `data` (bytes-like or a tensor, any dtype, contiguous) into the region at `offset`."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(data, torch.Tensor):
            src = data.detach().contiguous().view(-1).view(torch.uint8)
            self.tensor(offset, src.numel()).copy_(src)
            return
        src_mv = memoryview(data).cast("B")
        self.view(offset, src_mv.nbytes)[:] = src_mv

    def read_into(self, offset: int, out: Buffer) -> None:
        """Fill `out` (a writable bytes-like or a contiguous tensor) from the region at `offset`."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(out, torch.Tensor):
            if not out.is_contiguous():
                raise ValueError("read_into needs a contiguous output tensor")
            dst = out.view(-1).view(torch.uint8)
            dst.copy_(self.tensor(offset, dst.numel()))
            return
        dst_mv = memoryview(out).cast("B")
        dst_mv[:] = self.view(offset, dst_mv.nbytes)

    @abstractmethod
    def close(self) -> None:
        """Detach (a consumer) or release the memory (its owner). Idempotent."""

    def _check(self, offset: int, nbytes: int) -> None:
        if self.closed:
            raise ValueError(f"{type(self).__name__} is closed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise IndexError(f"bytes [{offset}, {offset + nbytes}) outside the region's {self.nbytes} bytes")

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostRegion(Region):
    """A region in host memory: zero-copy memoryviews and torch tensors over one buffer."""

    @abstractmethod
    def _buffer(self) -> memoryview:
        """The whole region as a writable 'B' memoryview (valid until close)."""

    def view(self, offset: int, nbytes: int) -> memoryview:
        self._check(offset, nbytes)
        return self._buffer()[offset : offset + nbytes]

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        import torch

        self._check(offset, nbytes)
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self._buffer(), dtype=torch.uint8, count=nbytes, offset=offset)
