"""The host's Aqua coordinator, run inside the agent, and its state as per-device telemetry.

The coordinator (`serving.aqua.coordinator.CoordinatorServer`) listens on a Unix socket whose path
engines receive as AQUA_COORDINATOR_SOCKET; each engine also gets AQUA_ENGINE_ID (its deployment id)
and AQUA_DEVICE (its first host-local device index). Engines lease and allocate with
producer_id/consumer_id = AQUA_ENGINE_ID, and name devices by host index ("cuda:<AQUA_DEVICE>",
or "cpu:0"): inside an engine CUDA_VISIBLE_DEVICES renumbers GPUs from 0, so the agent maps ids to
devices through the deployments it started first and only falls back to the device string.

A real host's coordinator listens on `<state_dir>/aqua.sock` unless that path is longer than an
AF_UNIX socket path may be; it then listens in a short, private runtime directory instead (see
`coordinator_socket`).

When the coordinator module is not importable the agent runs without it and every device reports
role "none".
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpu_agent.aqua_socket import coordinator_socket, private_dir
from gpu_agent.protocol import AquaRole
from serving.backoff import Backoff

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AquaDeviceState:
    """One device's side of lending, as telemetry reports it."""

    role: AquaRole = "none"
    lent_bytes: int = 0  # bytes of this device leased to the coordinator (producer)
    borrowed_bytes: int = 0  # bytes this device's engine holds in other devices' regions (consumer)
    paired_with: int | None = None


def is_host_memory(device: str) -> bool:
    """Whether a region's device string names host memory: "cpu", "cpu0", "cpu:1"."""
    return re.fullmatch(r"cpu(?::?\d+)?", device.strip().lower()) is not None


def _device_index(device: str) -> int | None:
    """ "cuda:3" / "gpu:3" / "3" -> 3; anything else (host memory too) -> None."""
    match = re.fullmatch(r"(?:[a-z]+:)?(\d+)", device.strip().lower())
    return int(match.group(1)) if match else None


def device_states(
    stats: dict[str, Any], engine_devices: dict[str, int], *, host_memory_device: int | None = None
) -> dict[int, AquaDeviceState]:
    """Turn `Coordinator.stats()` into per-device roles, bytes and pairings.

    Args:
        stats: {"regions": [{"producer_id", "device", "nbytes", "allocated_bytes",
            "consumer_id", ...}], ...} as `Coordinator.stats()` returns it.
        engine_devices: Engine id (deployment id) -> its host device index.
        host_memory_device: The device index host memory is reported as: 0 on a CPU host (its one
            device is the CPU and host RAM); None on a GPU host, where host memory is no device's:
            a region lent from host memory ("cpu", "cpu0", "cpu:1", whoever lends it) then counts
            as no device's lent bytes, though its consumer's borrowed bytes still count.

    Returns:
        Device index -> state, for devices that lend or borrow (others are "none"). A device
        paired several ways is paired with the first in lease order (region "r2" before "r10").
        A device that both lends and borrows is reported as a consumer (its engine is short of
        memory, which is what an operator must see); lent bytes are still reported.
    """
    lent: dict[int, int] = {}
    borrowed: dict[int, int] = {}
    pair_of: dict[int, int] = {}
    for region in sorted(stats.get("regions", []), key=_lease_order):
        device = str(region.get("device", ""))
        if is_host_memory(device):  # host DRAM, whichever engine lends it: never a GPU's memory
            producer = host_memory_device
        else:
            producer = engine_devices.get(str(region.get("producer_id")))
            if producer is None:
                producer = _device_index(device)
        if producer is not None:
            lent[producer] = lent.get(producer, 0) + int(region.get("nbytes", 0))
        consumer_id = region.get("consumer_id")
        consumer = engine_devices.get(str(consumer_id)) if consumer_id is not None else None
        used = int(region.get("allocated_bytes", 0))
        # A consumer's borrowed bytes count even when the lender's device cannot be placed.
        if consumer is not None and used > 0:
            borrowed[consumer] = borrowed.get(consumer, 0) + used
            if producer is not None:
                pair_of.setdefault(producer, consumer)
                pair_of.setdefault(consumer, producer)
    out: dict[int, AquaDeviceState] = {}
    for dev in sorted(set(lent) | set(borrowed)):
        role: AquaRole = "consumer" if borrowed.get(dev) else "producer"
        out[dev] = AquaDeviceState(role, lent.get(dev, 0), borrowed.get(dev, 0), pair_of.get(dev))
    return out


def _lease_order(region: dict[str, Any]) -> tuple[int, int, str]:
    """Sort key of a region in lease order: the coordinator numbers regions "r1", "r2", ... "r10"
    as it leases them (as text "r10" would come before "r2"); any other id after those, by text."""
    region_id = str(region.get("region_id"))
    match = re.fullmatch(r"r(\d+)", region_id)
    return (0, int(match.group(1)), "") if match else (1, 0, region_id)


class AquaHost:
    """Starts the coordinator server in-process if `serving.aqua.coordinator` is importable, and
    starts it again should it end or stop answering.

    The coordinator serves on its own thread. Were that thread to end, its socket file be removed,
    or its loop hang (connections accepted, never answered), engines could no longer use it, and
    every engine started later would be given a socket nothing answers on. So each `refresh()` (every
    telemetry tick, off any engine's path) checks it: a missing socket file restarts it at once;
    otherwise a liveness probe (connect, `ping`, within `probe_timeout_s`) must answer, and after
    `probe_failures` failed probes in a row the coordinator is restarted, its stale socket file
    removed. A restart is logged at ERROR; starts that fail are retried with backoff.
    Stopping it ends every session (a hung one's connections are shut down from outside its loop):
    producers and consumers see their connection close (CoordinatorUnavailable), which tells them
    their leases and allocations are gone, and they fall back. The new coordinator starts empty.

    A sick coordinator makes `refresh()` block for seconds (probe, restart), so it must never run on
    the agent's event loop: the agent runs it in a worker thread (`asyncio.to_thread`), one at a
    time, and its telemetry tick, on the loop, reads the snapshot the last `refresh()` left through
    `stats()` / `device_states()`, which never block.
    `refresh()` calls never overlap (a call made while one runs returns that last snapshot), and
    `stop()` may come from the loop while one runs: what they share is swapped under a lock.

    Args:
        socket_path: Where the coordinator listens.
        private: Make (and check) the socket's directory with `private_dir` at every start.
        backoff: Delays between failed starts; default 1 s doubling to 60 s.
        probe_timeout_s: Seconds a liveness probe waits for each reply.
        probe_failures: Failed probes in a row after which the coordinator is restarted.
        stop_timeout_s: Seconds a restart waits for the old coordinator's thread to end.
    """

    def __init__(
        self,
        socket_path: str,
        backoff: Backoff | None = None,
        *,
        private: bool = False,
        probe_timeout_s: float = 0.5,
        probe_failures: int = 3,
        stop_timeout_s: float = 2.0,
    ) -> None:
        if not (probe_timeout_s > 0 and math.isfinite(probe_timeout_s)):  # also refuses nan
            raise ValueError(f"{probe_timeout_s=} must be positive and finite")
        if probe_failures < 1:
            raise ValueError(f"{probe_failures=} must be >= 1")
        if not (stop_timeout_s >= 0 and math.isfinite(stop_timeout_s)):
            raise ValueError(f"{stop_timeout_s=} must be >= 0 and finite")
        self.requested_socket = socket_path
        self.private = private
        self.probe_timeout_s = probe_timeout_s
        self.probe_failures = probe_failures
        self.stop_timeout_s = stop_timeout_s
        # _server, _wanted: set by start()/stop() (the loop) and by a restart (refresh()'s thread);
        # a compound change to them holds _lock, which is never held while waiting on anything.
        self._lock = threading.Lock()
        self._server: Any = None
        self._wanted = False  # start() was called and stop() was not
        self._refreshing = threading.Lock()  # held by the one refresh() running
        self._last: dict[str, Any] | None = None  # the snapshot the last refresh() took
        # Only refresh() (one at a time) touches these.
        self._backoff = backoff or Backoff(base_s=1.0, cap_s=60.0)
        self._next_try = 0.0  # monotonic time of the next restart attempt
        self._failed_probes = 0  # in a row
        self.restarts = 0

    @classmethod
    def for_state_dir(cls, state_dir: str, **kwargs: Any) -> AquaHost:
        """The coordinator of the agent whose state dir is `state_dir`, on `coordinator_socket`'s
        path; `kwargs` as for the constructor."""
        path, private = coordinator_socket(state_dir)
        return cls(path, private=private, **kwargs)

    @property
    def socket_path(self) -> str | None:
        """The socket engines should use: the coordinator's whenever one is meant to run (`start()`
        was called, found the coordinator importable, and `stop()` was not), even while it is down.

        The host reads it once, when it builds its engine launcher. A coordinator that failed to
        start, or was restarted, listens on this same path once it is up, and the engines' KV stores
        offload to DRAM until it answers (serving/aqua/offload/lent.py), so they need the path
        from the start. None when no coordinator is meant to run.
        """
        return self.requested_socket if self._wanted else None

    def start(self) -> bool:
        """Start the coordinator; False (logged) if its module is missing or it fails to start."""
        try:
            from serving.aqua.coordinator import CoordinatorServer
        except ImportError as exc:
            log.warning("Aqua coordinator not available (%s); engines run without memory lending.", exc)
            return False
        with self._lock:
            self._wanted = True
        return self._start(CoordinatorServer(self.requested_socket))

    def _start(self, server: Any) -> bool:
        """Start `server` (a CoordinatorServer) and keep it, unless `stop()` was called, even
        meanwhile; whether it now runs."""
        if not self._wanted:
            return False
        try:
            directory = os.path.dirname(self.requested_socket) or "."
            if self.private:  # made again should a temp cleaner have removed it
                private_dir(directory)
            else:
                os.makedirs(directory, exist_ok=True)
            server.start()
        except (OSError, RuntimeError) as exc:
            log.error("Aqua coordinator failed to start on %s: %s", self.requested_socket, exc)
            return False
        with self._lock:
            kept = self._wanted  # stop() may have run while this one started: never leave it running
            if kept:
                self._server = server
        if not kept:
            server.stop(timeout=self.stop_timeout_s)
            return False
        log.info("Aqua coordinator listening on %s.", self.requested_socket)
        return True

    def _keep_up(self) -> bool:
        """Check the coordinator and restart it if it is gone or dead (see the class docstring);
        whether it is up and answering now."""
        if not self._wanted:
            return False
        if self._server is not None:
            if _is_socket(self.requested_socket):
                error = self._probe()
                if error is None:
                    self._failed_probes = 0
                    return True
                self._failed_probes += 1
                log.warning(
                    "Aqua coordinator on %s did not answer a liveness probe (%d/%d): %s",
                    self.requested_socket,
                    self._failed_probes,
                    self.probe_failures,
                    error,
                )
                if self._failed_probes < self.probe_failures:
                    return False
                why = f"it failed {self._failed_probes} liveness probes in a row"
            else:
                why = "its socket is gone"
            log.error(
                "Aqua coordinator on %s: %s; restarting it (its sessions end).", self.requested_socket, why
            )
            self._discard_server()
        now = time.monotonic()
        if now < self._next_try or not self._wanted:  # not wanted: stop() came meanwhile
            return False
        from serving.aqua.coordinator import CoordinatorServer  # importable: start() succeeded

        self.restarts += 1
        if self._start(CoordinatorServer(self.requested_socket)):
            self._backoff.reset()
            return True
        self._next_try = now + self._backoff.next_delay()
        return False

    def _probe(self) -> str | None:
        """One liveness round trip to the coordinator through its socket; None, or what failed."""
        from serving.aqua.coordinator import AquaClient, CoordinatorError

        try:
            with AquaClient(
                self.requested_socket, name="agent/liveness", timeout=self.probe_timeout_s, connect_timeout=0
            ) as client:
                client.ping()
        except CoordinatorError as exc:  # also CoordinatorUnavailable: refused, closed, timed out
            return str(exc)
        return None

    def _discard_server(self) -> None:
        """Stop the current coordinator and remove its socket file, even if its thread is stuck."""
        with self._lock:
            server, self._server = self._server, None
        self._failed_probes = 0
        if server is None:  # stop() took it meanwhile
            return
        if not server.stop(timeout=self.stop_timeout_s):  # its clients were hung up on
            log.error("Aqua coordinator on %s is stuck; leaving its thread behind.", self.requested_socket)
        # Left by a dead coordinator, or still bound by a stuck one (which will not remove ours).
        if _is_socket(self.requested_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.requested_socket)

    def refresh(self) -> dict[str, Any] | None:
        """Check the coordinator (restarting it if need be) and take its stats snapshot; None if it
        is not running. Blocks up to seconds while it is sick: call it off the event loop."""
        if not self._refreshing.acquire(blocking=False):  # another thread is at it
            return self._last
        try:
            stats = self._sample()
            self._last = stats if self._wanted else None  # not one taken across a stop()
            return stats
        finally:
            self._refreshing.release()

    def _sample(self) -> dict[str, Any] | None:
        if not self._keep_up():
            return None
        server = self._server
        if server is None:  # stop() took it meanwhile
            return None
        try:
            result: dict[str, Any] = server.call(lambda c: c.stats(), timeout=2.0)
        except Exception as exc:  # a stuck or dead coordinator must not stop telemetry
            log.warning("Aqua coordinator stats failed: %s", exc)
            return None
        return result

    def stats(self) -> dict[str, Any] | None:
        """The stats snapshot the last `refresh()` took (None before one, or if the coordinator was
        not running then). Never blocks: the agent's telemetry tick, on its event loop, reads it."""
        return self._last

    def device_states(
        self, engine_devices: dict[str, int], *, host_memory_device: int | None = None
    ) -> dict[int, AquaDeviceState]:
        """Per-device states from the last `refresh()`'s snapshot (never blocks); arguments as for
        the module's `device_states`."""
        stats = self.stats()
        if stats is None:
            return {}
        return device_states(stats, engine_devices, host_memory_device=host_memory_device)

    def stop(self) -> None:
        """Stop the coordinator; a `refresh()` running meanwhile starts no new one."""
        with self._lock:
            self._wanted = False
            server, self._server = self._server, None
        self._last = None
        if server is not None:
            server.stop(timeout=self.stop_timeout_s)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False
