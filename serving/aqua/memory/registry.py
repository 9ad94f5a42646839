"""The one registry of region kinds: how a consumer opens a handle a producer leased."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from serving.aqua.memory.base import Region, RegionUnavailable

# kind -> "module:Class" whose `attach(handle)` opens it; imported on first use, so a CPU host
# never imports the CUDA module unless it meets a CUDA handle.
_OPENERS: dict[str, str | Callable[[dict[str, Any]], Region]] = {
    "shm": "serving.aqua.memory.shm:ShmRegion",
    "cuda_ipc": "serving.aqua.memory.cuda_ipc:CudaIpcRegion",
}


def register_region_kind(kind: str, opener: Callable[[dict[str, Any]], Region]) -> None:
    """Teach `open_region` a new handle kind; a duplicate kind raises ValueError."""
    if kind in _OPENERS:
        raise ValueError(f"region kind {kind!r} is already registered")
    _OPENERS[kind] = opener


def open_region(handle: dict[str, Any]) -> Region:
    """Attach the memory a producer described in `handle` (from `Allocation.handle`).

    Raises:
        RegionUnavailable: the kind is unknown or private to another process ("dram"), or the
            memory cannot be opened here (segment gone, no CUDA).
    """
    kind = handle.get("kind") if isinstance(handle, dict) else None
    opener = _OPENERS.get(kind) if isinstance(kind, str) else None
    if opener is None:
        raise RegionUnavailable(f"cannot open a region of kind {kind!r}; known: {sorted(_OPENERS)}")
    if isinstance(opener, str):
        module, _, name = opener.partition(":")
        opener = getattr(importlib.import_module(module), name).attach
    return opener(handle)
