"""`AquaClient`: the synchronous, thread-safe aqua-lib client of the host coordinator.

One client is one Unix-socket connection, i.e. one coordinator *session* (see
`serving.aqua.coordinator.coordinator` for what a session owns and what its disconnect does).
Threads may share a client: calls are serialised on the connection. A client must not be used
across `fork()`: the child raises CoordinatorUnavailable and must open its own. The child's copy of
every connection is closed as it starts: a forked child (a worker, a compile pool) outliving its
parent would otherwise hold the parent's session open, its leases lendable and its allocations
held, until the child exits.

Primitives:
    producer:  lease, resize, unlease, request_reclaim, reclaim_status, wait_reclaimed
    consumer:  allocate, free, pending_reclaims, allocation
    any:       stats, ping, close
Refusals raise the typed `CoordinatorError` subclasses of `serving.aqua.coordinator.errors`.

CoordinatorUnavailable means the session is over (server gone, connection lost, or no reply
within `timeout`; the client then hangs up, and every later call raises it too). A reply out of
step with its request (ProtocolError) also makes the client hang up. After either, the session is
over: the server has freed this client's allocations and withdrawn its leases, and may already
have handed the bytes to another consumer. Never read lent data after it: fall back (recompute).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from serving.aqua.coordinator.errors import (
    CallInFlight,
    CoordinatorError,
    CoordinatorUnavailable,
    InsufficientMemory,
    ProtocolError,
    error_from_code,
)
from serving.aqua.coordinator.protocol import MAX_FRAME, decode, encode
from serving.aqua.coordinator.records import Allocation, ReclaimStatus

CONNECT_ATTEMPT_S = 1.0  # the most one connection attempt may take
# poll() events of a connection the peer closed (POLLHUP and POLLERR are reported unasked; Linux
# reports a peer's close of a Unix stream socket as POLLHUP and POLLRDHUP)
_HANG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


class AquaClient:
    """A connection to the coordinator at `socket_path`.

    Args:
        socket_path: the server's Unix socket.
        name: a label for this session in the server's bookkeeping (e.g. "engine-a/scheduler").
        timeout: seconds to wait for any one reply before giving up (the connection is then closed);
            positive and finite (checked before connecting: ValueError).
        connect_timeout: seconds to keep retrying the connection while the server starts.
    """

    def __init__(
        self,
        socket_path: str,
        *,
        name: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        # Checked before connecting: settimeout would refuse it only once connected, leaving that
        # connection (a session on the server) open until the client is garbage-collected; and 0
        # (non-blocking) would fail every call as if the coordinator were gone.
        if not (isinstance(timeout, int | float) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"{timeout=} must be a positive, finite number of seconds")
        self.socket_path = os.fspath(socket_path)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pid = os.getpid()
        self._sock = _connect(self.socket_path, connect_timeout)
        self._sock.settimeout(timeout)
        self._reader = self._sock.makefile("rb")
        _CLIENTS.add(self)
        try:
            hello = self._call("hello", name=name, pid=self._pid)
            self.session: str = hello["session"]
        except (CoordinatorError, KeyError, TypeError) as exc:
            # Whatever answers on the path is no coordinator (another program, a bad reply): for
            # the caller, as for `CoordinatorSession`'s backoff, that is no coordinator there.
            self.close()
            if isinstance(exc, CoordinatorUnavailable):
                raise
            what = f"{self.socket_path} did not answer as a coordinator"
            raise CoordinatorUnavailable(f"{what}: {exc}") from exc

    # ----------------------------------------------------------------- producer
    def lease(self, producer_id: str, device: str, nbytes: int, handle: dict[str, Any]) -> str:
        """Lend `nbytes` of `device` memory, attachable through `handle`; returns the region id."""
        return str(self._call("lease", producer_id=producer_id, device=device, nbytes=nbytes, handle=handle))

    def resize(self, region_id: str, nbytes: int) -> None:
        """Grow or shrink a leased region (RegionBusy if shrinking would cut an allocation off)."""
        self._call("resize", region_id=region_id, nbytes=nbytes)

    def unlease(self, region_id: str) -> None:
        """Withdraw an empty region (RegionBusy while allocations remain: reclaim first)."""
        self._call("unlease", region_id=region_id)

    def request_reclaim(self, region_id: str) -> ReclaimStatus:
        """Close the region to new allocations and ask its consumer to give it back."""
        status: ReclaimStatus = self._call("request_reclaim", region_id=region_id)
        return status

    def reclaim_status(self, region_id: str) -> ReclaimStatus:
        """ "none", "pending" (allocations remain) or "done" (empty: the producer may unlease)."""
        status: ReclaimStatus = self._call("reclaim_status", region_id=region_id)
        return status

    def wait_reclaimed(self, region_id: str, timeout: float, poll_interval: float = 0.01) -> bool:
        """Poll `reclaim_status` until "done"; False if `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while self.reclaim_status(region_id) != "done":
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_interval)
        return True

    # ----------------------------------------------------------------- consumer
    def allocate(
        self,
        consumer_id: str,
        nbytes: int,
        device_hint: str | None = None,
        *,
        min_nbytes: int | None = None,
        exclude_regions: Iterable[str] = (),
        strict: bool = False,
        wait: bool = True,
    ) -> Allocation | None:
        """`nbytes` contiguous bytes of one lent region, or None (InsufficientMemory if `strict`).

        With `min_nbytes`, the largest piece of at least that size when no region holds `nbytes`
        (check the allocation's `nbytes`). No region named in `exclude_regions` is used. A
        coordinator older than one of these arguments refuses it (InvalidArgument, "unexpected
        arguments" naming it); each is sent only when given. With `wait=False` the call is not
        sent while another thread's call waits for its reply (CallInFlight): an engine's step
        then waits for its own round trip only, never for the other one's."""
        args: dict[str, Any] = {"consumer_id": consumer_id, "nbytes": nbytes, "device_hint": device_hint}
        if min_nbytes is not None:  # only when asked: older coordinators refuse the argument
            args["min_nbytes"] = min_nbytes
        excluded = list(exclude_regions)
        if excluded:
            args["exclude_regions"] = excluded
        data = self._request("allocate", args, wait=wait)
        if data is None:
            if strict:
                raise InsufficientMemory(f"no lent region can hold {nbytes} bytes for {consumer_id!r}")
            return None
        return Allocation.from_dict(data)

    def free(self, alloc_id: str, consumer_id: str | None = None) -> None:
        """Release an allocation (UnknownAllocation if already freed; NotOwner on a consumer mismatch)."""
        self._call("free", alloc_id=alloc_id, consumer_id=consumer_id)

    def pending_reclaims(self, consumer_id: str) -> list[Allocation]:
        """This consumer's allocations in regions under reclaim: evacuate their data, then free them."""
        return [Allocation.from_dict(d) for d in self._call("pending_reclaims", consumer_id=consumer_id)]

    def allocation(self, alloc_id: str) -> Allocation:
        """The live allocation `alloc_id` (UnknownAllocation once freed)."""
        return Allocation.from_dict(self._call("allocation", alloc_id=alloc_id))

    # ----------------------------------------------------------------- any
    def stats(self) -> dict[str, Any]:
        """Per-device leased/allocated bytes, regions, producer->consumer pairings (Coordinator.stats)."""
        result: dict[str, Any] = self._call("stats")
        return result

    def ping(self) -> None:
        self._call("ping")

    def connected(self) -> bool:
        """Whether the session is still up, without a round trip and without waiting: False once
        the server has closed the connection (it ended the session and freed its allocations) or
        this client was closed.

        Between calls nothing may arrive (every reply answers a request), so a readable socket means
        end-of-file or an error; `poll` first, because a socket with a timeout waits in `recv`.
        (`poll`, not `select`: select refuses descriptors from FD_SETSIZE (1024) up, which an engine
        process holding many files reaches.) While another thread's call waits for its reply (it
        holds the call lock for up to `timeout`), this never waits for it: an engine's step checks
        its session here while its watcher waits on a slow coordinator. A reply may then be
        arriving, so only a hang-up counts (POLLHUP / POLLRDHUP / POLLERR: the server closed).
        """
        if not self._lock.acquire(blocking=False):  # a call is in flight: look, never wait
            return self._open_in_flight()
        try:
            if self._sock.fileno() < 0:
                return False
            try:
                poller = select.poll()
                poller.register(self._sock, select.POLLIN)
                return not poller.poll(0) or self._sock.recv(1, socket.MSG_PEEK) != b""
            except OSError:
                return False
        finally:
            self._lock.release()

    def _open_in_flight(self) -> bool:
        """`connected()` while another thread's call holds the lock: that call may close the socket
        meanwhile, so a descriptor seen closed, before or after polling, means the session ended."""
        fd = self._sock.fileno()
        if fd < 0:
            return False
        try:
            poller = select.poll()
            poller.register(fd, _HANG_UP)
            hung_up = bool(poller.poll(0))
        except (OSError, ValueError):
            return False
        return not hung_up and self._sock.fileno() >= 0

    def close(self) -> None:
        """Close the connection: the server then frees this session's allocations and withdraws its leases."""
        with self._lock:
            self._hang_up()

    def _hang_up(self) -> None:
        """Close the reader and the socket (lock held). The reader holds a reference to the socket's
        descriptor: closing the socket alone leaves the connection open, and with it the session
        (its allocations held, its leases lendable), until the client is garbage-collected."""
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> AquaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- wire
    def _call(self, op: str, **args: Any) -> Any:
        return self._request(op, args, wait=True)

    def _request(self, op: str, args: dict[str, Any], *, wait: bool) -> Any:
        """One call; with `wait` False, CallInFlight at once while another thread's call holds
        the connection (waits for its reply) instead of waiting for it."""
        if os.getpid() != self._pid:
            raise CoordinatorUnavailable("AquaClient used after fork(); open a new client in this process")
        req_id = next(self._ids)
        if not self._lock.acquire(blocking=wait):  # only when not waiting: another call is in flight
            raise CallInFlight(f"{op} not sent: another call on this session is waiting for its reply")
        try:
            reply = self._round_trip(req_id, op, args)
        finally:
            self._lock.release()
        if reply.get("ok"):
            return reply.get("result")
        err = reply["error"]
        raise error_from_code(str(err.get("code")), str(err.get("message")))

    def _round_trip(self, req_id: int, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Send one request and read its reply (lock held)."""
        if self._sock.fileno() < 0:
            raise CoordinatorUnavailable("client is closed")
        try:
            self._sock.sendall(encode({"id": req_id, "op": op, "args": args}))
            line = self._reader.readline(MAX_FRAME + 1)
        except (OSError, ValueError) as exc:  # timeouts are OSErrors too
            self._hang_up()
            raise CoordinatorUnavailable(f"coordinator at {self.socket_path}: {exc}") from exc
        if not line.endswith(b"\n"):  # end of stream (the server never sends a longer frame)
            self._hang_up()
            raise CoordinatorUnavailable(f"coordinator at {self.socket_path} closed the connection")
        try:
            reply = decode(line)
            if reply.get("id") != req_id:
                raise ProtocolError(f"reply id {reply.get('id')!r} does not match request id {req_id}")
            if not reply.get("ok") and not isinstance(reply.get("error"), dict):
                raise ProtocolError(f"a reply neither ok nor an error: {str(reply)[:200]}")
        except ProtocolError:
            # Replies are no longer in step with requests, or the peer does not speak the
            # protocol: every later call would read another call's answer. The session ends
            # here (later calls raise CoordinatorUnavailable).
            self._hang_up()
            raise
        return reply


_CLIENTS: weakref.WeakSet[AquaClient] = weakref.WeakSet()


def _close_in_child() -> None:
    """In a forked child, close its copies of the parent's connections (the parent's stay open),
    so that the parent's sessions end when the parent does. The lock may have been copied held by
    a parent thread that does not exist here: each client gets a fresh one."""
    for client in list(_CLIENTS):
        client._lock = threading.Lock()
        with contextlib.suppress(OSError):
            os.close(client._sock.detach())


os.register_at_fork(after_in_child=_close_in_child)


def _connect(path: str, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Not blocking: a blocking connect to a listener whose backlog is full (a hung server that
        # accepts nothing) waits for ever; with a timeout it fails at once and is retried here.
        sock.settimeout(CONNECT_ATTEMPT_S)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise CoordinatorUnavailable(f"cannot connect to coordinator at {path}: {exc}") from exc
            time.sleep(0.05)
