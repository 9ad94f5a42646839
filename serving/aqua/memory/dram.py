"""`DramBuffer`: host memory in the consumer's own process, the fallback when nothing is lent.

Backed by a torch uint8 tensor, pinned (page-locked) when CUDA is available so device copies
run asynchronously at full PCIe bandwidth (`torch.empty(n, dtype=uint8, pin_memory=True)`);
a plain tensor otherwise. It cannot be attached from another process.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from serving.aqua.memory.base import HostRegion


class DramBuffer(HostRegion):
    """`nbytes` of this process's host memory (pinned when `pin`, default: when CUDA is available)."""

    kind = "dram"

    def __init__(self, nbytes: int, *, pin: bool | None = None) -> None:
        super().__init__(nbytes, "cpu", owner=True)
        self.pinned = torch.cuda.is_available() if pin is None else pin
        self._tensor: torch.Tensor | None = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)
        self._mv: memoryview | None = memoryview(self._tensor.numpy().data).cast("B")

    def handle(self) -> dict[str, Any]:
        # Informational only: open_region refuses "dram" handles (the memory is process-private).
        return {"kind": self.kind, "pid": os.getpid(), "nbytes": self.nbytes}

    def _buffer(self) -> memoryview:
        assert self._mv is not None
        return self._mv

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        self._check(offset, nbytes)
        assert self._tensor is not None
        return self._tensor[offset : offset + nbytes]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._mv = None
        self._tensor = None
