"""Plain records the coordinator hands out: allocations and reclaim states.

They cross process boundaries (socket frames, vLLM connector metadata), so each converts to and
from a JSON-able dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ReclaimStatus = Literal["none", "pending", "done"]
RECLAIM_STATES: tuple[ReclaimStatus, ...] = ("none", "pending", "done")


@dataclass(frozen=True)
class Allocation:
    """A consumer's piece of a lent region: bytes [offset, offset + nbytes) of region `region_id`.

    `handle` is the region's attach handle (as the producer leased it), so a consumer can open the
    memory with `serving.aqua.memory.open_region(handle)` and use `view(offset, nbytes)`.
    `withdrawn` is set only in `pending_reclaims` answers when the producer's session is gone:
    the producer can no longer be asked for anything, and the consumer should evacuate and free
    at once (a shared-memory mapping it already holds stays readable; device memory may not).
    """

    alloc_id: str
    region_id: str
    producer_id: str
    consumer_id: str
    device: str
    offset: int
    nbytes: int
    handle: dict[str, Any] = field(default_factory=dict)
    withdrawn: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Allocation:
        return cls(
            alloc_id=str(data["alloc_id"]),
            region_id=str(data["region_id"]),
            producer_id=str(data["producer_id"]),
            consumer_id=str(data["consumer_id"]),
            device=str(data["device"]),
            offset=int(data["offset"]),
            nbytes=int(data["nbytes"]),
            handle=dict(data.get("handle") or {}),
            withdrawn=bool(data.get("withdrawn", False)),
        )

    @property
    def end(self) -> int:
        """One past the last byte of the allocation within its region."""
        return self.offset + self.nbytes
