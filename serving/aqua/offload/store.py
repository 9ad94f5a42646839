"""The `KVStore` interface: keyed byte buffers holding preempted requests' KV.

A store hands out a writable buffer for a key (`reserve`), which the caller fills with one
aggregated copy; `get` returns a readable view of it until `discard`. A store may lose an entry
(a lent region reclaimed without room to evacuate): `get` then returns None and the caller must
recompute, never read stale memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch


def check_nbytes(nbytes: int) -> None:
    """Refuse a `reserve` size that is not positive (a caller's bug, not a lack of room: None would
    read as "try the next tier", and a zero-size entry would be an empty save to restore)."""
    if nbytes <= 0:
        raise ValueError(f"reserve: {nbytes=} must be positive")


class KVStore(ABC):
    """Keyed byte buffers in one memory tier."""

    tier: ClassVar[str]

    @abstractmethod
    def reserve(self, key: str, nbytes: int) -> torch.Tensor | None:
        """Hold `nbytes` for `key` and return them as a writable uint8 tensor.

        Called by the worker when it offloads a preempted request, before the gather. A key that
        is already present is replaced.

        Args:
            key: The request id.
            nbytes: Size of the aggregated KV buffer; positive (a request offloads at least one
                block). Every store checks it first with `check_nbytes`.

        Returns:
            A contiguous uint8 tensor of `nbytes` elements, or None when this tier has no room
            (all-or-nothing: nothing is held then).

        Raises:
            ValueError: `nbytes` is not positive; nothing changes (a held `key` stays held).
        """

    @abstractmethod
    def get(self, key: str) -> torch.Tensor | None:
        """The buffer stored under `key` (read-only by convention), or None if absent or lost."""

    @abstractmethod
    def discard(self, key: str) -> None:
        """Release `key`'s buffer (restored or request finished). Unknown keys are ignored."""

    @abstractmethod
    def keys(self) -> list[str]:
        """Keys currently held, sorted."""

    def poll(self) -> list[str]:
        """Keys that must leave this store now (its memory is being reclaimed).

        Called once per engine step. The caller copies each listed key's buffer to a lower tier
        (or gives it up) and then calls `discard(key)`; once all are discarded the store gives
        its memory back. Entries stay readable until discarded.
        """
        return []

    def close(self) -> None:
        """Release every buffer; the store is unusable afterwards."""
        for key in self.keys():
            self.discard(key)
