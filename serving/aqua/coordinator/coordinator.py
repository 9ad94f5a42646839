"""The host coordinator's state machine: who lent which region, who holds which bytes of it.

A pure object (no I/O, no threads): every method runs to completion and leaves the state
consistent, so a server that calls it from one event loop or under one lock makes every
operation atomic. The rules (the protocol of Aqua, ASPLOS'25, with the choices this project made):

- A producer *leases* a region of its memory (`nbytes` on `device`, attachable through `handle`;
  if the handle states the memory's size as "nbytes", the lease may not exceed it), may *resize*
  it (never below the end of its highest allocation) and *unlease* it (refused while any
  allocation remains; the producer files a reclaim and waits instead).
- A consumer *allocates* `nbytes` all-or-nothing inside ONE region (first fit, offsets aligned to
  `ALIGNMENT`), or gets None; one that names a `min_nbytes` gets, when no region can hold
  `nbytes`, the largest piece of at least that many bytes; regions it names in `exclude_regions`
  (say, ones it could not attach) are passed over. Regions under reclaim are never used.
  At most one consumer per region: a region with allocations serves only their consumer; it is
  free for any consumer again once the last one is freed. A region is never given to its own
  producer, i.e. to a consumer id equal to its producer id: engines lease and allocate under one
  engine id (AQUA_ENGINE_ID) from separate sessions, and one that both lends and borrows borrows
  from other producers only (lending to itself would only move its KV into its own memory, and a
  reclaim would have it wait on itself). Ids, not sessions, name engines: one client session may
  lease as one id and allocate as another (tools and tests do).
- *request_reclaim* closes a region to new allocations; *reclaim_status* is "pending" while
  allocations remain and "done" from the moment the last is freed. Consumers learn what to give
  back from *pending_reclaims*. Producers are notified, never forced: nothing is freed for them.
- Sessions (one per client connection) own what they created. Producer operations on a region are
  allowed only to the session that leased it. Any session may free an allocation (an engine's
  scheduler process may allocate what its worker process frees), optionally checked against the
  consumer id. When a session disconnects: its allocations are freed; its regions are *withdrawn*:
  closed to allocations, reported to their consumer by `pending_reclaims` with `withdrawn=True`,
  and removed once empty (at once if already empty).
- A client session may hold at most `SessionLimits.max_leases` regions and
  `SessionLimits.max_allocations` allocations at once; beyond that it is refused (SessionLimit).
  The in-process host's session (`LOCAL_SESSION`) is not capped (see `limits.py`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from serving.aqua.coordinator.errors import (
    InvalidArgument,
    NotOwner,
    RegionBusy,
    UnknownAllocation,
    UnknownRegion,
)
from serving.aqua.coordinator.limits import SessionLimits, SessionQuota
from serving.aqua.coordinator.records import Allocation, ReclaimStatus

# Offsets inside a region are multiples of this: keeps every allocation aligned for vectorised
# host copies and CUDA copies (cudaMalloc itself aligns to 256 bytes).
ALIGNMENT = 256
LOCAL_SESSION = "local"
# Sizes travel as signed 64-bit integers (off_t, torch sizes). An unbounded one is worse than
# absurd: JSON carries ints of up to 4300 digits, and a sum of two such leases in `stats` is one
# Python refuses to print, so every client asking for stats would lose its session.
MAX_NBYTES = (1 << 63) - 1
# A handle is sent back in every allocation of its region (allocate, allocation, pending_reclaims):
# one that cannot be sent back (too deep to encode, or making the reply exceed the frame limit)
# would end the session of each consumer placed on it. Real ones are flat and a few hundred bytes.
MAX_HANDLE_BYTES = 4096
MAX_HANDLE_DEPTH = 8  # levels of dicts and lists, the handle's own included
# Ids and device names travel in every allocation too; real ones are a few dozen characters.
MAX_NAME = 1024


@dataclass
class _Region:
    seq: int
    region_id: str
    producer_id: str
    session: str
    device: str
    nbytes: int
    handle: dict[str, Any]
    reclaiming: bool = False
    withdrawn: bool = False
    # alloc_id -> Allocation, kept sorted by offset (first fit walks the gaps in order)
    allocs: dict[str, Allocation] = field(default_factory=dict)

    @property
    def consumer_id(self) -> str | None:
        for alloc in self.allocs.values():
            return alloc.consumer_id
        return None

    @property
    def allocated_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocs.values())

    @property
    def high_water(self) -> int:
        return max((a.end for a in self.allocs.values()), default=0)

    def reclaim_status(self) -> ReclaimStatus:
        if not self.reclaiming:
            return "none"
        return "pending" if self.allocs else "done"

    def first_fit(self, nbytes: int) -> int | None:
        cursor = 0
        for alloc in self.allocs.values():
            if alloc.offset - cursor >= nbytes:
                return cursor
            cursor = _align(alloc.end)
        return cursor if cursor + nbytes <= self.nbytes else None

    def largest_gap(self) -> tuple[int, int]:
        """(offset, size) of the largest free aligned run of bytes; the first one on ties."""
        best = (0, 0)
        cursor = 0
        for alloc in self.allocs.values():
            if alloc.offset - cursor > best[1]:
                best = (cursor, alloc.offset - cursor)
            cursor = _align(alloc.end)
        if self.nbytes - cursor > best[1]:
            best = (cursor, self.nbytes - cursor)
        return best


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_NBYTES:
        raise InvalidArgument(f"{name}={value!r} must be a positive integer of at most {MAX_NBYTES}")
    return value


def _within_memory(nbytes: int, handle: dict[str, Any]) -> None:
    # A handle's "nbytes", when present, is the size of the memory behind it: a lease (or a
    # resize) may cover part of that memory, never more.
    size = handle.get("nbytes")
    if isinstance(size, int) and nbytes > size:
        raise InvalidArgument(f"{nbytes=} exceeds the {size} bytes of memory behind the handle")


def _handle_copy(handle: object) -> dict[str, Any]:
    """A private, JSON-able copy of a lease's handle, refused if it could not be sent back."""
    # Types only in the messages: the repr of a deeply nested value would itself recurse too far.
    if not isinstance(handle, dict):
        raise InvalidArgument(f"handle must be a dict with a string 'kind', not a {type(handle).__name__}")
    if not isinstance(handle.get("kind"), str):
        raise InvalidArgument(f"handle's 'kind' must be a string, not a {type(handle.get('kind')).__name__}")
    if not _nested_within(handle, MAX_HANDLE_DEPTH):  # checked first: json.dumps would recurse
        raise InvalidArgument(f"handle nests dicts and lists more than {MAX_HANDLE_DEPTH} deep")
    try:
        data = json.dumps(handle)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"handle must be JSON-serialisable: {exc}") from None
    if len(data.encode()) > MAX_HANDLE_BYTES:
        raise InvalidArgument(f"handle of {len(data.encode())} bytes exceeds {MAX_HANDLE_BYTES}")
    copy: dict[str, Any] = json.loads(data)
    return copy


def _nested_within(value: object, depth: int) -> bool:
    # Recurses at most `depth` + 1 levels, however deep `value` is.
    if isinstance(value, dict):
        return depth > 0 and all(_nested_within(v, depth - 1) for v in value.values())
    if isinstance(value, list | tuple):
        return depth > 0 and all(_nested_within(v, depth - 1) for v in value)
    return True


def _region_ids(name: str, value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise InvalidArgument(f"{name}={value!r} must be a list of region ids")
    return frozenset(value)


def _name(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name}={value!r} must be a non-empty string")
    if len(value) > MAX_NAME:
        raise InvalidArgument(f"{name} of {len(value)} characters exceeds {MAX_NAME}")
    return value


class Coordinator:
    """Lease / allocate / reclaim bookkeeping for the lent memory of one host (see module doc).

    Args:
        limits: What one client session may hold at once (default `SessionLimits()`).
    """

    def __init__(self, limits: SessionLimits | None = None) -> None:
        self.limits = limits if limits is not None else SessionLimits()
        # Leases of live sessions (a withdrawn region no longer counts) and allocations, per session
        self._leases = SessionQuota("leases", "max_leases", self.limits.max_leases, LOCAL_SESSION)
        self._alloc_quota = SessionQuota(
            "allocations", "max_allocations", self.limits.max_allocations, LOCAL_SESSION
        )
        # region_id -> region, in lease order (the tie-break when several regions fit)
        self._regions: dict[str, _Region] = {}
        # alloc_id -> (allocation, session that made it)
        self._allocs: dict[str, tuple[Allocation, str]] = {}
        self._next_region = 1
        self._next_alloc = 1

    # ----------------------------------------------------------------- producer side
    def lease(
        self,
        producer_id: str,
        device: str,
        nbytes: int,
        handle: dict[str, Any],
        *,
        session: str = LOCAL_SESSION,
    ) -> str:
        """Offer `nbytes` of `device` memory, attachable through `handle`; returns the region id.

        `handle` is a JSON-able dict with a string "kind", at most `MAX_HANDLE_BYTES` as JSON and
        `MAX_HANDLE_DEPTH` levels deep: every allocation of the region is sent with it.
        """
        _name("producer_id", producer_id)
        _name("device", device)
        _positive_int("nbytes", nbytes)
        handle = _handle_copy(handle)
        _within_memory(nbytes, handle)
        self._leases.check(session)
        region_id = f"r{self._next_region}"
        self._regions[region_id] = _Region(
            self._next_region, region_id, producer_id, session, device, nbytes, handle
        )
        self._next_region += 1
        self._leases.take(session)
        return region_id

    def resize(self, region_id: str, nbytes: int, *, session: str = LOCAL_SESSION) -> None:
        """Grow or shrink a region; shrinking below its highest allocated byte raises RegionBusy."""
        region = self._owned(region_id, session)
        _positive_int("nbytes", nbytes)
        _within_memory(nbytes, region.handle)
        if nbytes < region.high_water:
            raise RegionBusy(
                f"region {region_id}: cannot shrink to {nbytes} bytes, allocations reach {region.high_water}"
            )
        region.nbytes = nbytes

    def unlease(self, region_id: str, *, session: str = LOCAL_SESSION) -> None:
        """Withdraw an empty region; raises RegionBusy while allocations remain (reclaim first)."""
        region = self._owned(region_id, session)
        if region.allocs:
            raise RegionBusy(
                f"region {region_id} holds {len(region.allocs)} allocation(s) of consumer "
                f"{region.consumer_id!r}; request a reclaim and wait for it"
            )
        del self._regions[region_id]
        self._leases.give(session)

    def request_reclaim(self, region_id: str, *, session: str = LOCAL_SESSION) -> ReclaimStatus:
        """Close a region to new allocations and ask its consumer to give it back; idempotent.

        Returns the status right after the request ("done" at once if the region is empty).
        """
        region = self._owned(region_id, session)
        region.reclaiming = True
        return region.reclaim_status()

    def reclaim_status(self, region_id: str) -> ReclaimStatus:
        """ "none" (no reclaim filed), "pending" (allocations remain) or "done" (region empty)."""
        return self._region(region_id).reclaim_status()

    # ----------------------------------------------------------------- consumer side
    def allocate(
        self,
        consumer_id: str,
        nbytes: int,
        device_hint: str | None = None,
        *,
        min_nbytes: int | None = None,
        exclude_regions: list[str] | None = None,
        session: str = LOCAL_SESSION,
    ) -> Allocation | None:
        """Give `consumer_id` `nbytes` contiguous bytes of one region, or None if none can.

        Candidates: regions not under reclaim, not held by another consumer and not leased
        under `consumer_id` as the producer id (no engine borrows its own memory). They are tried in
        order: on `device_hint` first, then already held by this consumer, then lease order.
        With `min_nbytes` (at most `nbytes`), when no candidate can hold `nbytes`, the largest
        contiguous piece of at least `min_nbytes` bytes any candidate has (the first one in that
        order on ties) is given instead: a consumer asking for more than any producer lends still
        gets what there is. Regions named in `exclude_regions` are never candidates (unknown ids are
        ignored: a region may be gone by the time its consumer names it).
        """
        _name("consumer_id", consumer_id)
        _positive_int("nbytes", nbytes)
        if device_hint is not None:
            _name("device_hint", device_hint)
        if min_nbytes is not None and _positive_int("min_nbytes", min_nbytes) > nbytes:
            raise InvalidArgument(f"{min_nbytes=} must be at most {nbytes=}")
        excluded = _region_ids("exclude_regions", exclude_regions)
        self._alloc_quota.check(session)
        candidates = [
            r
            for r in self._regions.values()
            if not r.reclaiming
            and r.consumer_id in (None, consumer_id)
            and r.region_id not in excluded
            and r.producer_id != consumer_id
        ]
        candidates.sort(
            key=lambda r: (
                device_hint is not None and r.device != device_hint,
                r.consumer_id != consumer_id,
                r.seq,
            )
        )
        for region in candidates:
            offset = region.first_fit(nbytes)
            if offset is not None:
                return self._place(region, consumer_id, offset, nbytes, session)
        if min_nbytes is None:
            return None
        best: tuple[_Region, int, int] | None = None  # (region, offset, size) of the largest gap
        for region in candidates:
            offset, size = region.largest_gap()
            if size >= min_nbytes and (best is None or size > best[2]):
                best = (region, offset, size)
        if best is None:
            return None
        return self._place(best[0], consumer_id, best[1], min(nbytes, best[2]), session)

    def _place(self, region: _Region, consumer_id: str, offset: int, nbytes: int, session: str) -> Allocation:
        alloc = Allocation(
            alloc_id=f"a{self._next_alloc}",
            region_id=region.region_id,
            producer_id=region.producer_id,
            consumer_id=consumer_id,
            device=region.device,
            offset=offset,
            nbytes=nbytes,
            handle=region.handle,
        )
        self._next_alloc += 1
        region.allocs[alloc.alloc_id] = alloc
        region.allocs = dict(sorted(region.allocs.items(), key=lambda kv: kv[1].offset))
        self._allocs[alloc.alloc_id] = (alloc, session)
        self._alloc_quota.take(session)
        return alloc

    def free(self, alloc_id: str, consumer_id: str | None = None, *, session: str = LOCAL_SESSION) -> None:
        """Release an allocation; with `consumer_id`, refuse (NotOwner) if it belongs to another."""
        try:
            alloc, _ = self._allocs[alloc_id]
        except KeyError:
            raise UnknownAllocation(f"no live allocation {alloc_id!r}") from None
        if consumer_id is not None and alloc.consumer_id != consumer_id:
            raise NotOwner(
                f"allocation {alloc_id} belongs to consumer {alloc.consumer_id!r}, not {consumer_id!r}"
            )
        self._drop(alloc)

    def pending_reclaims(self, consumer_id: str) -> list[Allocation]:
        """The consumer's allocations in regions under reclaim (or withdrawn), by allocation id."""
        out = [
            Allocation(**{**a.to_dict(), "withdrawn": r.withdrawn})
            for r in self._regions.values()
            if r.reclaiming
            for a in r.allocs.values()
            if a.consumer_id == consumer_id
        ]
        return sorted(out, key=lambda a: int(a.alloc_id[1:]))

    def allocation(self, alloc_id: str) -> Allocation:
        """The live allocation `alloc_id` (UnknownAllocation once freed)."""
        try:
            return self._allocs[alloc_id][0]
        except KeyError:
            raise UnknownAllocation(f"no live allocation {alloc_id!r}") from None

    # ----------------------------------------------------------------- sessions and telemetry
    def disconnect(self, session: str) -> None:
        """A client is gone: free its allocations, withdraw its regions (see module doc)."""
        for alloc, owner in list(self._allocs.values()):
            if owner == session:
                self._drop(alloc)
        for region in list(self._regions.values()):
            if region.session == session:
                region.reclaiming = region.withdrawn = True
                if not region.allocs:
                    del self._regions[region.region_id]
        self._leases.forget(session)

    def stats(self) -> dict[str, Any]:
        """Telemetry snapshot (JSON-able).

        Returns:
            {"devices": {device: {"leased_bytes", "allocated_bytes", "regions", "allocations"}},
             "regions": [{"region_id", "producer_id", "device", "nbytes", "allocated_bytes",
                          "allocations", "consumer_id", "reclaim", "withdrawn"}],
             "pairings": [{"producer_id", "consumer_id", "region_id", "device"}]}
        """
        devices: dict[str, dict[str, int]] = {}
        regions, pairings = [], []
        for r in self._regions.values():
            d = devices.setdefault(
                r.device, {"leased_bytes": 0, "allocated_bytes": 0, "regions": 0, "allocations": 0}
            )
            d["leased_bytes"] += r.nbytes
            d["allocated_bytes"] += r.allocated_bytes
            d["regions"] += 1
            d["allocations"] += len(r.allocs)
            regions.append(
                {
                    "region_id": r.region_id,
                    "producer_id": r.producer_id,
                    "device": r.device,
                    "nbytes": r.nbytes,
                    "allocated_bytes": r.allocated_bytes,
                    "allocations": len(r.allocs),
                    "consumer_id": r.consumer_id,
                    "reclaim": r.reclaim_status(),
                    "withdrawn": r.withdrawn,
                }
            )
            if r.consumer_id is not None:
                pairings.append(
                    {
                        "producer_id": r.producer_id,
                        "consumer_id": r.consumer_id,
                        "region_id": r.region_id,
                        "device": r.device,
                    }
                )
        return {"devices": dict(sorted(devices.items())), "regions": regions, "pairings": pairings}

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by the property tests)."""
        seen = set()
        for r in self._regions.values():
            consumers = {a.consumer_id for a in r.allocs.values()}
            assert len(consumers) <= 1, f"region {r.region_id} shared by consumers {sorted(consumers)}"
            cursor = 0
            for a in r.allocs.values():
                assert a.region_id == r.region_id and a.offset % ALIGNMENT == 0
                assert a.offset >= cursor, f"allocations overlap in region {r.region_id}"
                cursor = a.end
                assert self._allocs[a.alloc_id][0] is a
                seen.add(a.alloc_id)
            assert cursor <= r.nbytes, f"region {r.region_id} allocated beyond its {r.nbytes} bytes"
            assert r.reclaiming or not r.withdrawn
            assert not (r.withdrawn and not r.allocs), f"empty withdrawn region {r.region_id} kept"
        assert seen == set(self._allocs), "allocation index out of step with the regions"
        leases = Counter(r.session for r in self._regions.values() if not r.withdrawn)
        assert self._leases.snapshot() == dict(leases), "lease counts out of step with the regions"
        allocs = Counter(session for _, session in self._allocs.values())
        assert self._alloc_quota.snapshot() == dict(allocs), "allocation counts out of step"

    # ----------------------------------------------------------------- internals
    def _region(self, region_id: str) -> _Region:
        try:
            return self._regions[region_id]
        except (KeyError, TypeError):
            raise UnknownRegion(f"no leased region {region_id!r}") from None

    def _owned(self, region_id: str, session: str) -> _Region:
        region = self._region(region_id)
        if region.session != session:
            raise NotOwner(
                f"region {region_id} was leased by another session (producer {region.producer_id!r})"
            )
        return region

    def _drop(self, alloc: Allocation) -> None:
        _, session = self._allocs.pop(alloc.alloc_id)
        self._alloc_quota.give(session)
        region = self._regions[alloc.region_id]
        del region.allocs[alloc.alloc_id]
        if region.withdrawn and not region.allocs:
            del self._regions[region.region_id]
