"""`LenderAgent`: a producer process that lends one region and gives it back when asked.

    python -m serving.aqua.producer --socket S --device cpu0 --nbytes N [--producer-id ID]
        [--reclaim-after SECONDS] [--reclaim-timeout SECONDS] [--call-timeout SECONDS]

`cpu*` devices lend a POSIX shared-memory segment this process creates and owns; `cuda:I` lends
a CUDA IPC buffer on GPU I. Events go to stdout as JSON lines, flushed:

    {"event": "leased", "producer_id", "region_id", "device", "nbytes", "handle"}
    {"event": "reclaiming", "region_id"}
    {"event": "reclaimed", "region_id", "clean": true|false, "seconds"}
    {"event": "withdrawn", "region_id"}    (the coordinator went away; "leased" follows once
                                            a new one answers)

SIGUSR1 (or --reclaim-after) starts the reclaim: request it, poll until every consumer allocation
is freed, unlease, release the memory, exit 0. SIGTERM/SIGINT/SIGHUP do the same: a hang-up (the
terminal or ssh session closed) reaches the whole process group, the multiprocessing resource
tracker included, so nothing else would unlink the segment (a SIGKILL of the group leaves it
behind: the next producer or coordinator to start unlinks it, see `shm_names`). If consumers do not
give the region back within --reclaim-timeout the agent exits 3 anyway; its disconnect withdraws
the region (consumers see it in pending_reclaims with withdrawn=True). A reclaim while nothing is
lent (the coordinator is gone) exits 0 at once; one whose coordinator goes away midway exits 3.

If the coordinator goes away (the host agent restarts it: every session ends, the new coordinator
starts empty), the lease is gone with it. The agent releases that memory and leases FRESH memory
once a new coordinator answers (one connection attempt per backoff period): a consumer that has
not yet noticed the restart may still have the old memory mapped, so it is never lent again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from serving.aqua.coordinator import AquaClient, CoordinatorError, CoordinatorUnavailable
from serving.aqua.coordinator.session import CoordinatorSession
from serving.aqua.memory.base import Region
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.memory.shm_names import SHM_DIR, sweep_stale_segments

log = logging.getLogger(__name__)
KEEP_INTERVAL_S = 0.1  # how often the lender process checks that its lease still stands
MAX_NBYTES = (1 << 63) - 1  # a region's size travels as a signed 64-bit integer (off_t, torch sizes)


class LenderAgent:
    """Lend `nbytes` of `device` memory through the coordinator at `socket_path`.

    The first session is opened at once (CoordinatorUnavailable if no coordinator answers within
    `connect_timeout` seconds); later ones by `keep_lent`. Each call waits `call_timeout` seconds
    for its reply: a hung coordinator then ends the session (withdrawing the lease) instead of
    holding a reclaim for the client's default 30 s.
    """

    def __init__(
        self,
        socket_path: str,
        device: str,
        nbytes: int,
        producer_id: str | None = None,
        *,
        connect_timeout: float = 10.0,
        call_timeout: float = 5.0,
    ) -> None:
        if nbytes <= 0:
            raise ValueError(f"{nbytes=} must be positive")
        if re.fullmatch(r"cpu\d*|cuda:\d+", device) is None:
            raise ValueError(f"{device=} must be cpu<N> (shared memory) or cuda:<N> (CUDA IPC)")
        self.device = device
        self.nbytes = nbytes
        self.producer_id = producer_id or f"producer-{os.getpid()}"
        self._session = CoordinatorSession(
            socket_path, name=self.producer_id, timeout=call_timeout, connect_timeout=connect_timeout
        )
        self.region: Region | None = None
        self.region_id: str | None = None
        self._lease_client: AquaClient | None = None  # the session that holds the lease

    @property
    def client(self) -> AquaClient | None:
        """The current coordinator client."""
        return self._session.client

    def lend(self) -> str:
        """Create fresh memory and lease it; returns the region id."""
        if self.region_id is not None:
            raise RuntimeError(f"already lending region {self.region_id}")
        client = self._session.current()
        if client is None:
            raise CoordinatorUnavailable(f"no coordinator session at {self._session.socket_path}")
        try:
            region = _create_region(self.device, self.nbytes)
        except OSError as exc:
            raise RuntimeError(f"cannot create a {self.nbytes}-byte region on {self.device}: {exc}") from exc
        try:
            region_id = client.lease(self.producer_id, self.device, self.nbytes, region.handle())
        except BaseException:
            region.close()
            raise
        self.region, self.region_id, self._lease_client = region, region_id, client
        return region_id

    def keep_lent(self) -> bool:
        """Lend again if the coordinator went away; returns whether a region is leased now.

        Called periodically. While the lease's session is up it costs no round trip. Once that
        session has ended (the coordinator withdrew the lease), the memory is released (never
        lent again: see the module doc) and, when a new session opens, fresh memory is leased.
        """
        if self.region_id is not None:
            if self._lease_client is not None and self._lease_client.connected():
                return True
            self._withdrawn()
        if self._session.ensure() is None:
            return False
        try:
            self.lend()
        except (CoordinatorError, RuntimeError) as exc:
            log.warning("aqua: %s could not lend again: %s", self.producer_id, exc)
            return False
        return True

    def reclaim(self, timeout: float, poll_interval: float = 0.01) -> bool:
        """Reclaim the region: wait for its consumer to free it, unlease, release the memory.

        Returns True if the consumer gave it back within `timeout` (or nothing was lent); False
        otherwise, in which case the region stays leased (and is withdrawn when this agent's
        connection closes), or was withdrawn already because the coordinator went away.
        """
        if self.region_id is None:
            self._release_memory()
            return True
        client = self._lease_client
        try:
            if client is None or not client.connected():
                raise CoordinatorUnavailable("the lease's session has ended")
            client.request_reclaim(self.region_id)
            if not client.wait_reclaimed(self.region_id, timeout, poll_interval):
                return False
            client.unlease(self.region_id)
        except CoordinatorUnavailable:
            self._withdrawn()
            return False
        self.region_id = self._lease_client = None
        self._release_memory()
        return True

    def close(self) -> None:
        """Disconnect (withdrawing anything still leased) and release the memory."""
        self._session.close()
        self._release_memory()

    def _withdrawn(self) -> None:
        """The lease's session ended: the coordinator withdrew the region; release its memory."""
        log.warning("aqua: %s lost its coordinator; region %s withdrawn", self.producer_id, self.region_id)
        self.region_id = self._lease_client = None
        self._release_memory()

    def _release_memory(self) -> None:
        if self.region is not None:
            self.region.close()
            self.region = None


def _create_region(device: str, nbytes: int) -> Region:
    if device.startswith("cuda:"):
        from serving.aqua.memory.cuda_ipc import CudaIpcRegion

        return CudaIpcRegion.create(nbytes, int(device.split(":", 1)[1]))
    return ShmRegion.create(nbytes, device=device)


def _emit(event: str, **fields: Any) -> None:
    """Print one event. Once stdout is gone (its reader exited, or a hang-up closed the terminal:
    EPIPE, EIO) events are dropped: failing here would skip the reclaim, and with it the unlink."""
    if sys.stdout is None:
        return
    try:
        print(json.dumps({"event": event, **fields}), flush=True)
    except OSError:
        with contextlib.suppress(OSError):
            sys.stdout.close()  # unflushed: the exit's flush would fail (and exit 120) again
        sys.stdout = None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= threading.TIMEOUT_MAX:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds in 0..{threading.TIMEOUT_MAX:.0f}"
        )
    return value


def _nbytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if not 1 <= value <= MAX_NBYTES:
        raise argparse.ArgumentTypeError(f"{text!r} must be in 1..{MAX_NBYTES}")
    return value


def _shm_free_bytes() -> int | None:
    """Bytes free (to this user) in the shared-memory file system; None where it is not there."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.aqua.producer", description=__doc__)
    parser.add_argument("--socket", required=True, help="the coordinator's Unix socket")
    parser.add_argument("--device", default="cpu0", help="cpu<N> (shared memory) or cuda:<N>")
    parser.add_argument(
        "--nbytes", type=_nbytes, required=True, help=f"bytes to lend (cpu*: at most what {SHM_DIR} has free)"
    )
    parser.add_argument("--producer-id", default=None, help="producer name (default producer-<pid>)")
    parser.add_argument(
        "--reclaim-after", type=_seconds, default=None, help="reclaim after this many seconds"
    )
    parser.add_argument("--reclaim-timeout", type=_seconds, default=30.0, help="give up waiting after (s)")
    parser.add_argument(
        "--call-timeout", type=_seconds, default=5.0, help="seconds to wait for each coordinator reply"
    )
    args = parser.parse_args(argv)
    if args.device.startswith("cpu"):
        # Segments of producers killed with their process group (no unlink ran): see shm_names.
        sweep_stale_segments()
    # A segment is sparse: creating one larger than the free space succeeds, and the lender (or a
    # consumer writing into it) is killed by SIGBUS once the space runs out.
    free = _shm_free_bytes() if args.device.startswith("cpu") else None
    if free is not None and args.nbytes > free:
        parser.error(f"--nbytes {args.nbytes} is more than the {free} bytes {SHM_DIR} has free")
    if args.call_timeout <= 0:
        parser.error(f"--call-timeout {args.call_timeout} must be positive")

    go = threading.Event()
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: go.set())
    agent = None
    try:
        agent = LenderAgent(
            args.socket, args.device, args.nbytes, args.producer_id, call_timeout=args.call_timeout
        )
        agent.lend()
    except (CoordinatorError, ValueError, OSError, RuntimeError) as exc:
        # CoordinatorError: any refusal, also one of a type this version does not know (a newer
        # coordinator's), or a reply out of step (ProtocolError): one line, not a traceback.
        print(f"error: {exc}", file=sys.stderr)
        if agent is not None:
            agent.close()
        return 1
    _emit_leased(agent)
    deadline = None if args.reclaim_after is None else time.monotonic() + args.reclaim_after
    while True:
        wait = KEEP_INTERVAL_S if deadline is None else min(KEEP_INTERVAL_S, deadline - time.monotonic())
        if wait <= 0 or go.wait(wait):
            break
        _keep_lent(agent)
    _emit("reclaiming", region_id=agent.region_id)
    start = time.monotonic()
    region_id = agent.region_id
    clean = agent.reclaim(args.reclaim_timeout)
    _emit("reclaimed", region_id=region_id, clean=clean, seconds=round(time.monotonic() - start, 4))
    agent.close()
    return 0 if clean else 3


def _emit_leased(agent: LenderAgent) -> None:
    assert agent.region is not None
    _emit(
        "leased",
        producer_id=agent.producer_id,
        region_id=agent.region_id,
        device=agent.device,
        nbytes=agent.nbytes,
        handle=agent.region.handle(),
    )


def _keep_lent(agent: LenderAgent) -> None:
    """`agent.keep_lent()`, reporting a withdrawn lease and a new one as events."""
    region, region_id = agent.region, agent.region_id
    agent.keep_lent()
    if agent.region is region:  # region ids restart at r1 with a new coordinator: compare memory
        return
    if region_id is not None:
        _emit("withdrawn", region_id=region_id)
    if agent.region is not None:
        _emit_leased(agent)


if __name__ == "__main__":
    sys.exit(main())
