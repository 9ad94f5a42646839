"""Where a preempted request's KV goes in the offload modes, and what moving it costs.

Primitives (called by the engine):
  save(req, nbytes)        -> seconds: the request is preempted; its KV blocks are copied out.
  restore(req)             -> seconds: the request is re-admitted; its KV is copied back.
  set_capacity(t, nbytes)  -> seconds: (peer only) the lender reclaims memory; KV that no longer
                              fits moves to host DRAM.

Costs come from `Link.seconds` (serving/costmodel/transfer.py): one transfer per request per move,
since the blocks are aggregated into one contiguous buffer (Aqua's "Aqua tensor").
"""

from __future__ import annotations

from serving.costmodel.transfer import PCIE5_X16, Link
from serving.sim.state import SimRequest


class DramStore:
    """Host DRAM behind PCIe; unbounded (servers hold far more DRAM than a GPU's KV cache)."""

    def __init__(self, link: Link = PCIE5_X16) -> None:
        self.link = link
        self.used_bytes = 0

    def save(self, req: SimRequest, nbytes: int) -> float:
        """Copy `nbytes` of `req`'s KV out of the GPU; returns the transfer seconds."""
        req.offloaded_bytes = nbytes
        req.offloaded_in_peer = False
        req.record.bytes_moved += nbytes
        self.used_bytes += nbytes
        return self.link.seconds(nbytes)

    def restore(self, req: SimRequest) -> float:
        """Copy `req`'s KV back to the GPU; returns the transfer seconds."""
        nbytes = req.offloaded_bytes
        req.offloaded_bytes = 0
        req.record.bytes_moved += nbytes
        self.used_bytes -= nbytes
        return self.link.seconds(nbytes)


class PeerStore(DramStore):
    """Memory lent by a paired GPU over NVLink, with DRAM as the fallback.

    A request's KV goes to the peer when it fits in the lent capacity left, else to DRAM. When
    the lender reclaims memory (`set_capacity` below what is used), the most recently saved
    requests move to DRAM over PCIe until the rest fits; the borrower pays for that copy.

    Attributes:
        capacity_bytes: Lent bytes currently available to this borrower.
        peer_link: The NVLink to the lender, the GPU's own (`costmodel.nvlink(gpu)`; no default).
        peer_used_bytes: Bytes of KV now held in lent memory.
        evacuated_bytes: Bytes moved from peer memory to DRAM by reclaims.
    """

    def __init__(self, capacity_bytes: int, peer_link: Link, dram_link: Link = PCIE5_X16) -> None:
        super().__init__(dram_link)
        if capacity_bytes < 0:
            raise ValueError(f"{capacity_bytes=} must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.peer_link = peer_link
        self.peer_used_bytes = 0
        self.evacuated_bytes = 0
        # req_id -> request, in save order (dicts keep insertion order): reclaim evicts from the end.
        self._in_peer: dict[int, SimRequest] = {}

    def save(self, req: SimRequest, nbytes: int) -> float:
        if self.peer_used_bytes + nbytes > self.capacity_bytes:
            return super().save(req, nbytes)
        req.offloaded_bytes = nbytes
        req.offloaded_in_peer = True
        req.record.bytes_moved += nbytes
        self.peer_used_bytes += nbytes
        self._in_peer[req.req_id] = req
        return self.peer_link.seconds(nbytes)

    def restore(self, req: SimRequest) -> float:
        if not req.offloaded_in_peer:
            return super().restore(req)
        nbytes = req.offloaded_bytes
        del self._in_peer[req.req_id]
        self.peer_used_bytes -= nbytes
        req.offloaded_bytes = 0
        req.offloaded_in_peer = False
        req.record.bytes_moved += nbytes
        return self.peer_link.seconds(nbytes)

    def set_capacity(self, capacity_bytes: int) -> float:
        """Change the lent capacity; returns the seconds spent moving KV that no longer fits to DRAM."""
        if capacity_bytes < 0:
            raise ValueError(f"{capacity_bytes=} must be >= 0")
        self.capacity_bytes = capacity_bytes
        seconds = 0.0
        while self.peer_used_bytes > capacity_bytes:
            _, req = self._in_peer.popitem()
            nbytes = req.offloaded_bytes
            self.peer_used_bytes -= nbytes
            self.used_bytes += nbytes
            self.evacuated_bytes += nbytes
            req.offloaded_in_peer = False
            req.record.bytes_moved += nbytes
            seconds += self.link.seconds(nbytes)
        return seconds
