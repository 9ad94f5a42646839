"""KV store in a region lent by a paired producer, leased through the aqua coordinator.

Protocol (aqua-lib, consumer side):
  * allocate `lent_bytes` from the coordinator (or, when no producer lends that much, the
    largest piece that holds the request at hand), attach the region through the allocation's
    handle, and carve per-request buffers out of it (first fit). A region that cannot be attached
    here is passed over (`exclude_regions`) for ATTACH_RETRY_S, so a later one is used instead. A
    piece smaller than `lent_bytes` is traded for a larger one, when one is free, whenever the
    store holds nothing (checked at most once per `retry_seconds`, on `reserve`). Arguments an older
    coordinator refuses are not sent again on that session;
  * a watcher thread asks the coordinator for `pending_reclaims` every WATCH_INTERVAL_S; once the
    allocation is listed, no new buffer is handed out and the engine's next `poll()` returns every
    held key for evacuation (the worker copies each to DRAM, then discards it here). A reclaim is
    a request (the producer waits for it), so noticing it within the interval is enough;
  * `poll()`, every engine step, makes no round trip: it only checks that the session's connection
    is still open (`AquaClient.connected`). A session that has ended has had its allocation freed,
    so the stored keys are dropped at once, unread (the requests recompute). `reserve` and `get`
    make the same check before handing out a view of the region, so a load in a step whose poll
    came before the session ended does not read it either;
  * when the last key is discarded the region is detached and the allocation freed (by the
    watcher, see below), which lets the producer's reclaim finish. After that nothing is read from
    the region: `get` returns None.
The watcher also frees an allocation that is being reclaimed while holding no key, so an idle
engine does not keep a producer waiting. A *withdrawn* allocation (the producer's session ended,
perhaps with its process) is evacuated like a reclaim only from host memory, whose mapping outlives
the producer; from device memory (CUDA IPC), freed with the producer's process, the stored keys
are dropped unread and the allocation freed: the requests recompute.

The coordinator may go away and a fresh, empty one start on the same socket (the host agent
restarts it). The ended session's allocation is gone with it: it is never freed on, nor mixed with,
a later session. The watcher opens a new session (`CoordinatorSession`: one connection attempt per
backoff period, off the engine's step), and once a producer lends to the new coordinator `reserve`
allocates from it again; until then the engine uses the next tier (DRAM). Reserve, get, poll and
discard never wait for a connection: while the coordinator is down they answer at once.

The coordinator may also hang: accept connections and never answer. Every call of this store's
session (`allocate` and `free` on the engine's step, `pending_reclaims` on the watcher, which the
step would wait for on the session's connection) gives up after `call_timeout_s` (default
CALL_TIMEOUT_S, not the client's 30 s), and a call that times out ends the session: the client hangs
up, and the coordinator, if it ever runs again, frees the session's allocations when it sees that.
So an `allocate` whose reply never came is treated as made and lost with its session: its memory is
never handed out, and no id of it is ever sent on the next session. The store falls back to DRAM
and the watcher reopens a session as after a restart. The watcher never holds the store's lock
across a round trip, so a step is held up by at most one call's timeout, and only by its own
`allocate` (the one round trip a step may make). Nor does the step wait for the watcher's round
trip on the shared client: its `allocate` is sent only when no other call is in flight
(`wait=False`); otherwise this save goes to the next tier and the next `reserve` tries again.

Freeing is split in two for that: under the lock `_release` detaches the region and forgets the
allocation (no view of it is handed out after that: `get` misses, `reserve` allocates anew), and
queues the free; the watcher sends the queued frees at its next check, outside the lock (and
`close()` sends what is left). So the engine's step never waits for a free: not when its `discard`
lets a reclaim finish, not when it trades a piece up, not when a region cannot be attached. Until
the free arrives the coordinator still counts the allocation as live, so an `allocate` racing it
gets other bytes and a new id (ids are never reused), never the one being freed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from serving.aqua.coordinator.errors import CallInFlight
from serving.aqua.offload.store import KVStore, check_nbytes

if TYPE_CHECKING:
    import torch

    from serving.aqua.coordinator.client import AquaClient
    from serving.aqua.coordinator.records import Allocation
    from serving.aqua.memory.base import Region

logger = logging.getLogger(__name__)

ALIGN = 256
WATCH_INTERVAL_S = 0.05  # how often the watcher asks the coordinator for pending reclaims
CALL_TIMEOUT_S = 1.0  # the longest a coordinator call may hold the engine's step
ATTACH_RETRY_S = 30.0  # how long a region that could not be attached is passed over
ATTACH_TRIES = 3  # allocations tried per attempt when regions cannot be attached


class LentRegionStore(KVStore):
    """Buffers inside one allocation of a lent region.

    Args:
        socket_path: The coordinator's Unix socket.
        consumer_id: This engine's consumer id.
        nbytes: Size of the allocation to request.
        retry_seconds: Minimum time between allocation attempts after a refusal.
        call_timeout_s: Seconds to wait for any one coordinator reply; a call that times out ends
            the session (see the module doc).
    """

    tier = "lent"

    def __init__(
        self,
        socket_path: str,
        consumer_id: str,
        nbytes: int,
        retry_seconds: float = 1.0,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        from serving.aqua.coordinator.session import CoordinatorSession

        if not (call_timeout_s > 0 and math.isfinite(call_timeout_s)):  # also refuses nan
            raise ValueError(f"{call_timeout_s=} must be positive and finite")
        self.consumer_id = consumer_id
        self.nbytes = nbytes
        self.retry_seconds = retry_seconds
        self.call_timeout_s = call_timeout_s
        self._session = CoordinatorSession(
            socket_path, name=f"{consumer_id}/kv-offload", timeout=call_timeout_s
        )
        if self._session.ensure() is None:  # e.g. the agent is restarting its coordinator
            logger.warning("aqua: no coordinator at %s yet; offloading to the next tier", socket_path)
        self._lock = threading.Lock()  # not reentrant: never nested
        self._frees: list[tuple[AquaClient, Allocation]] = []  # queued under the lock, sent by the watcher
        self._alloc: Allocation | None = None
        self._alloc_client: AquaClient | None = None  # the session that made _alloc (and owns it)
        self._region: Region | None = None
        self._base: torch.Tensor | None = None
        self._entries: dict[str, tuple[int, int]] = {}  # key -> (offset, nbytes) in the allocation
        self._reclaiming = False
        self._next_try = 0.0
        # Per coordinator session (region ids and what the coordinator takes are the session's):
        self._known_client: AquaClient | None = None
        self._refused_args: set[str] = set()  # optional allocate arguments it refused
        self._unattachable: dict[str, float] = {}  # region id -> until when it is passed over
        self.allocations = 0
        self.releases = 0
        self.sessions_lost = 0
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="aqua-lent-watch", daemon=True)
        self._watcher.start()

    @property
    def client(self) -> AquaClient:
        """The current coordinator client (its session may have ended)."""
        client = self._session.client
        if client is None:
            from serving.aqua.coordinator.errors import CoordinatorUnavailable

            raise CoordinatorUnavailable(f"no coordinator session at {self._session.socket_path} yet")
        return client

    def _send_frees(self) -> None:
        """Send the frees queued under the lock, with the lock let go (watcher thread, close)."""
        with self._lock:
            frees, self._frees = self._frees, []
        for client, alloc in frees:
            self._free(client, alloc)

    # -- allocation lifecycle -----------------------------------------------------------------------
    def _ensure_allocation(self, need: int) -> bool:
        """Whether an allocation is there to reserve from; if there is none, and an attempt is due,
        ask for `nbytes`, or, when no region lends that much, the largest piece that holds `need`."""
        if self._alloc is not None:
            if self._reclaiming or not self._session_up():
                return False
            if not self._entries and self._alloc.nbytes < self.nbytes:
                self._trade_up(need)
            return self._alloc is not None
        now = time.monotonic()
        if now < self._next_try:
            return False
        client = self._session.current()  # the watcher reconnects; the step never waits for it
        if client is None:
            return False
        self._next_try = now + self.retry_seconds
        try:
            got = self._allocate_attached(client, need, 0)
        except CallInFlight:  # the watcher's call waits for its reply: next tier, retry next save
            self._next_try = now
            return False
        if got is None:
            return False
        self._adopt(client, *got)
        return True

    def _trade_up(self, need: int) -> None:
        """The store is empty and holds a piece smaller than `nbytes`: take a larger one if one is
        free (asked for before the old piece is given back, so nothing is lost when none is)."""
        assert self._alloc is not None and self._alloc_client is not None
        now = time.monotonic()
        if now < self._next_try:
            return
        self._next_try = now + self.retry_seconds
        client = self._alloc_client
        try:
            got = self._allocate_attached(client, need, self._alloc.nbytes + 1)
        except CallInFlight:  # the watcher's call waits for its reply: keep the piece for now
            self._next_try = now
            return
        if got is None:
            self._session_up()  # a call that timed out ended the session, and the piece with it
            return
        self._release()
        self._adopt(client, *got)

    def _adopt(self, client: AquaClient, alloc: Allocation, region: Region) -> None:
        self._alloc, self._alloc_client, self._region = alloc, client, region
        self._base = region.tensor(alloc.offset, alloc.nbytes)
        self._reclaiming = False
        self.allocations += 1
        logger.info("aqua: allocated %d B of lent region %s", alloc.nbytes, alloc.region_id)

    def _allocate_attached(
        self, client: AquaClient, need: int, least: int
    ) -> tuple[Allocation, Region] | None:
        """An allocation of at least `least` bytes (and of `need`, rounded up) and its attached
        region, or None. A region that cannot be attached is freed and passed over for a while."""
        from serving.aqua.memory.registry import open_region

        for _ in range(ATTACH_TRIES):
            try:
                alloc = self._allocate(client, need, least)
            except CallInFlight:
                raise
            except Exception as exc:  # coordinator gone or silent: DRAM fallback
                # On a timeout the client has hung up: whatever the call may have allocated dies
                # with the session (the watcher opens a new one), and its id was never learnt here.
                logger.warning("aqua: coordinator allocate failed: %s", exc)
                return None
            if alloc is None:
                return None
            try:
                region = open_region(alloc.handle)
            except Exception as exc:
                logger.warning("aqua: cannot attach lent region %s: %s", alloc.region_id, exc)
            else:
                # A handle that does not state its memory's size lets a lease exceed the memory:
                # the coordinator cannot check it, so the piece is checked against what attached.
                if alloc.end <= region.nbytes:
                    return alloc, region
                logger.warning(
                    "aqua: lent region %s: allocation [%d, %d) exceeds its %d attached bytes",
                    alloc.region_id,
                    alloc.offset,
                    alloc.end,
                    region.nbytes,
                )
                region.close()
            self._unattachable[alloc.region_id] = time.monotonic() + ATTACH_RETRY_S
            self._frees.append((client, alloc))  # never used: nothing to detach first
        return None

    def _allocate(self, client: AquaClient, need: int, least: int) -> Allocation | None:
        from serving.aqua.coordinator.errors import InvalidArgument

        if client is not self._known_client:  # a new session, perhaps a newer coordinator
            self._known_client, self._refused_args = client, set()
            self._unattachable.clear()  # region ids name other regions on another coordinator
        now = time.monotonic()
        self._unattachable = {rid: t for rid, t in self._unattachable.items() if t > now}
        least = min(self.nbytes, max(least, -(-max(need, 1) // ALIGN) * ALIGN))
        while True:
            args: dict[str, Any] = {"min_nbytes": least, "exclude_regions": sorted(self._unattachable)}
            for name in self._refused_args:
                args.pop(name)
            try:
                # wait=False: the step never waits behind the watcher's round trip (CallInFlight)
                return client.allocate(self.consumer_id, self.nbytes, wait=False, **args)
            except InvalidArgument as exc:  # an older coordinator refuses the arguments it lacks
                refused = {n for n in args if "unexpected arguments" in str(exc) and repr(n) in str(exc)}
                if not refused:
                    raise
                self._refused_args |= refused

    def _session_up(self) -> bool:
        """Whether the session that made the allocation is still up; if not, drop what it held."""
        client = self._alloc_client
        if client is not None and client.connected():
            return True
        self._session_lost("the coordinator closed our session")
        return False

    def _release(self) -> None:
        """Detach the region and forget the allocation (no key may be held; lock held); its free is
        queued for the watcher (`_send_frees`), on the session that made it."""
        alloc, client, region = self._alloc, self._alloc_client, self._region
        self._entries.clear()
        self._alloc, self._alloc_client, self._region, self._base = None, None, None, None
        self._reclaiming = False
        if region is not None:
            region.close()
        if alloc is not None:
            assert client is not None
            self._frees.append((client, alloc))
            self.releases += 1

    def _free(self, client: AquaClient, alloc: Allocation) -> None:
        """Free a released allocation (outside the lock, off the engine's step: a round trip of up
        to one call timeout)."""
        # Only on the session that made it: an ended session's allocation died with it, and its id
        # may name another allocation on a new coordinator.
        if client.connected():
            try:
                client.free(alloc.alloc_id, self.consumer_id)
            except Exception as exc:
                logger.warning("aqua: free of %s failed: %s", alloc.alloc_id, exc)
        logger.info("aqua: gave back lent region %s", alloc.region_id)

    def _check_reclaim(self) -> None:
        """Ask the coordinator whether our allocation is being reclaimed (watcher thread).

        The round trip is made outside the store's lock: the engine's step must not wait on a
        slow coordinator for more than its own calls' timeout.
        """
        with self._lock:
            alloc, client = self._alloc, self._alloc_client
            if alloc is None or client is None:
                return
            # Under reclaim, host memory needs no more checks; device memory is still watched for
            # a withdrawal (the producer gave up waiting and exited) until it is given back.
            if self._reclaiming and self._readable_after_withdrawal():
                return
        try:
            pending = client.pending_reclaims(self.consumer_id)
            error = None
        except Exception as exc:
            pending, error = [], exc
        with self._lock:
            if self._alloc is not alloc:  # released meanwhile (by the step)
                return
            mine = next((a for a in pending if a.alloc_id == alloc.alloc_id), None)
            if error is not None:
                self._session_lost(f"pending_reclaims failed ({error})")
            elif mine is not None and mine.withdrawn and not self._readable_after_withdrawal():
                # The producer's session is gone, and its process may be: device memory it
                # exported is then freed under our mapping. Evacuating would copy garbage.
                self._drop_entries("the producer withdrew the region (its session ended)")
            elif mine is not None:
                self._reclaiming = True

    def _readable_after_withdrawal(self) -> bool:
        """Whether our mapping of the region outlives its producer: a host-memory mapping (shared
        memory) does; device memory (CUDA IPC) is freed with the producer's process."""
        from serving.aqua.memory.base import HostRegion

        return isinstance(self._region, HostRegion)

    def _session_lost(self, why: str) -> None:
        """Our session is over, and with it the allocation: the coordinator has freed it and may
        already have given the bytes to another consumer. Nothing stored there can be trusted, so
        nothing is evacuated: the requests recompute (get() now misses). The region is detached
        at once; the allocation is not freed (it died with the session)."""
        self.sessions_lost += 1
        self._drop_entries(why)

    def _drop_entries(self, why: str) -> None:
        """Forget every stored key unread (their requests recompute) and give the region back."""
        assert self._alloc is not None
        logger.warning(
            "aqua: %s; dropping %d stored request(s) of lent region %s",
            why,
            len(self._entries),
            self._alloc.region_id,
        )
        self._entries.clear()
        self._reclaiming = True
        self._release()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            self._session.ensure()  # reopen an ended session (with backoff); outside the lock
            self._check_reclaim()
            with self._lock:
                if self._alloc is not None and self._reclaiming and not self._entries:
                    self._release()
            self._send_frees()

    # -- KVStore --------------------------------------------------------------------------------------
    def reserve(self, key: str, nbytes: int) -> torch.Tensor | None:
        check_nbytes(nbytes)
        with self._lock:
            self._discard(key)
            if not self._ensure_allocation(nbytes) or self._base is None:
                return None
            offset = self._first_fit(nbytes)
            if offset is None:
                return None
            self._entries[key] = (offset, nbytes)
            return self._base[offset : offset + nbytes]

    def _first_fit(self, nbytes: int) -> int | None:
        assert self._alloc is not None
        cursor = 0
        for off, n in sorted(self._entries.values()):
            if off - cursor >= nbytes:
                return cursor
            cursor = -(-(off + n) // ALIGN) * ALIGN
        return cursor if self._alloc.nbytes - cursor >= nbytes else None

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self._base is None or not self._session_up():
                return None
            off, n = entry
            return self._base[off : off + n]

    def discard(self, key: str) -> None:
        with self._lock:
            self._discard(key)

    def _discard(self, key: str) -> None:
        if self._entries.pop(key, None) is not None and self._reclaiming and not self._entries:
            self._release()

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def poll(self) -> list[str]:
        with self._lock:
            if self._alloc is not None and not self._session_up():
                return []
            if not self._reclaiming:
                return []
            # Nothing held under a reclaim: the watcher frees it (no round trip on the step).
            return sorted(self._entries)

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=5.0)
        with self._lock:
            self._release()
        self._send_frees()
        self._session.close()
