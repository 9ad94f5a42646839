"""`ShmRegion`: a POSIX shared-memory segment created and owned by a producer's process.

The producer `create()`s the segment and unlinks it on `close()`. Consumers `attach()` by name,
map it, and never unlink it. Python < 3.13 registers every attached segment with the process's
multiprocessing resource tracker, which unlinks it when that process exits (bpo-39959): a
consumer exiting would destroy the producer's memory. Attaching therefore opts out of tracking
(`track=False` on 3.13+, an explicit unregister before that) unless this process created the
segment itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from serving.aqua.memory.base import HostRegion, RegionUnavailable
from serving.aqua.memory.shm_names import segment_name

# Names of segments created by this process: attaching to one of them must not unregister it,
# which would cancel the creator's own registration (the tracker keeps one entry per name).
_CREATED_HERE: set[str] = set()


class ShmRegion(HostRegion):
    """A shared-memory segment of `nbytes` bytes (see module doc for ownership)."""

    kind = "shm"

    def __init__(self, shm: SharedMemory, nbytes: int, device: str, *, owner: bool) -> None:
        super().__init__(nbytes, device, owner=owner)
        if nbytes > shm.size:
            raise ValueError(f"{nbytes=} exceeds the segment's {shm.size} bytes")
        self._shm = shm
        self.name = shm.name

    @classmethod
    def create(cls, nbytes: int, *, device: str = "cpu0", name: str | None = None) -> ShmRegion:
        """Create (and own) a new zero-filled segment; `name` defaults to a fresh one naming this
        process as its owner (`shm_names.segment_name`: swept once this process is dead)."""
        if nbytes <= 0:
            raise ValueError(f"{nbytes=} must be positive")
        name = name or segment_name()
        shm = SharedMemory(name=name, create=True, size=nbytes)
        _CREATED_HERE.add(shm._name)  # type: ignore[attr-defined]
        return cls(shm, nbytes, device, owner=True)

    @classmethod
    def attach(cls, handle: dict[str, Any]) -> ShmRegion:
        """Map the segment a producer leased (RegionUnavailable if it no longer exists)."""
        if handle.get("kind") != cls.kind or not isinstance(handle.get("name"), str):
            raise ValueError(f"not a shared-memory handle: {handle!r}")
        try:
            shm = _attach_untracked(handle["name"])
        except FileNotFoundError as exc:
            raise RegionUnavailable(f"shared-memory segment {handle['name']!r} no longer exists") from exc
        nbytes = int(handle.get("nbytes") or shm.size)
        return cls(shm, nbytes, str(handle.get("device", "cpu0")), owner=False)

    def handle(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "nbytes": self.nbytes, "device": self.device}

    def _buffer(self) -> memoryview:
        buf = self._shm.buf
        assert buf is not None
        return buf

    def close(self) -> None:
        """Unmap; the owner also unlinks the segment. Views still held keep their pages mapped."""
        if self.closed:
            return
        self.closed = True
        try:
            self._shm.close()
        except BufferError:
            # A caller still holds a view or tensor of the mapping: it stays valid for them and is
            # unmapped when the last one goes. Unlinking below only removes the name.
            self._shm._buf = None  # type: ignore[attr-defined]
            self._shm._mmap = None  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):
                os.close(self._shm._fd)  # type: ignore[attr-defined]
            self._shm._fd = -1  # type: ignore[attr-defined]
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
            _CREATED_HERE.discard(self._shm._name)  # type: ignore[attr-defined]


def _attach_untracked(name: str) -> SharedMemory:
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, create=False, track=False)  # type: ignore[call-arg,unused-ignore]
    shm = SharedMemory(name=name, create=False)
    if shm._name not in _CREATED_HERE:  # type: ignore[attr-defined]
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm
