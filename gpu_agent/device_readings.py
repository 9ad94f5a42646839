"""The host's device readings, taken off the agent's event loop, as telemetry reports them.

A GPU in a bad state (an Xid error, fallen off the bus) can make an NVML call block for minutes.
Were `Inventory.sample()` called on the agent's event loop, the whole loop would stop with it: no
heartbeats, statuses or commands, so the control plane would call the host offline and the gateway
stop routing to every engine on it, though they serve fine. So `DeviceReadings.refresh()` samples
the inventory in a worker thread, one at a time (the agent starts it with `in_daemon_thread` each
telemetry tick and waits for it a bounded time), and the tick reads, through `latest()`, which
never blocks, the last sample taken:

- the last good sample, as it was, while it is at most `max_age_s` old (measured from when that
  sample started);
- otherwise (a sample is stuck, or every sample raises) each registered device with unknown
  readings, as a GPU that NVML cannot read is reported: 0 bytes used and 0 free (the protocol's
  memory fields are not nullable), `null` utilisation, temperature and power. A warning is logged
  once when this starts, and once when a fresh sample ends it.

The worker is a daemon thread, not the loop's default executor: a thread stuck in NVML never
returns, and the executor's threads are joined when the agent exits (`asyncio.run`, then the
interpreter), so a stuck one would hold the exit for ever. `close()` at stop waits for a sample
that is running until it has run `CLOSE_WAIT_S` in all (NVML answers in milliseconds a GPU), then
shuts NVML down. A sample still running then is stuck: `close()` leaves NVML uninitialised (no
`nvmlShutdown`, which could block behind the stuck call) and returns; the process exits right
after, which releases the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from gpu_agent.inventory import Inventory
from gpu_agent.protocol import DeviceSample

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a sample may have run for `close()` to wait for it to end. NVML answers in milliseconds
# a GPU, so a sample that has run this long is stuck (or as good as), and the stop goes on without it.
CLOSE_WAIT_S = 0.5


class _Snapshot(NamedTuple):
    started: float  # monotonic time the sample started
    devices: list[DeviceSample]


class DeviceReadings:
    """`inventory.sample()` run by `refresh()` (in a worker thread), read by `latest()` (on the loop).

    `refresh()` calls never overlap: one made while another runs returns at once, taking no sample.

    Args:
        inventory: The host's devices (NVML or CPU).
        max_age_s: How old the last good sample may be and still be reported.
        clock: Monotonic seconds; tests pass a fake one.
    """

    def __init__(
        self, inventory: Inventory, *, max_age_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (max_age_s > 0 and math.isfinite(max_age_s)):  # also refuses nan
            raise ValueError(f"{max_age_s=} must be positive and finite")
        self.inventory = inventory
        self.max_age_s = max_age_s
        self._clock = clock
        self._indices = [d.index for d in inventory.describe()]
        self._since = clock()  # where a missing sample's age is counted from
        self._last: _Snapshot | None = None  # swapped whole by refresh(), read by latest()
        self._sampling = threading.Lock()  # held by the one refresh() running, and by close()
        self._sampling_since: float | None = None  # when the refresh() running started its sample
        self._stale = False  # latest() reports unknown readings, and has warned so (loop only)

    def refresh(self) -> None:
        """Sample the inventory (blocking: run it in a worker thread). Exceptions propagate."""
        if not self._sampling.acquire(blocking=False):
            return
        try:
            self._sampling_since = started = self._clock()
            self._last = _Snapshot(started, self.inventory.sample())
        finally:
            self._sampling_since = None
            self._sampling.release()

    def latest(self) -> list[DeviceSample]:
        """Each device's readings for a telemetry frame, by the module's rule; never blocks."""
        last, now = self._last, self._clock()
        if last is not None and now - last.started <= self.max_age_s:
            if self._stale:
                self._stale = False
                log.warning("Device sampling recovered; devices report their readings again.")
            return list(last.devices)
        age = now - (last.started if last is not None else self._since)
        if age > self.max_age_s and not self._stale:
            self._stale = True
            log.warning(
                "No device sample (%s) has completed for %.1f s (a device may hang its driver); "
                "devices report unknown readings until one does.",
                self.inventory.kind,
                age,
            )
        return [DeviceSample(index=i, memory_used_bytes=0, memory_free_bytes=0) for i in self._indices]

    def close(self) -> None:
        """Close the inventory once a running sample ends; if it has not ended by the time it has
        run `CLOSE_WAIT_S` in all, it is stuck: leave the inventory as it is (see the module).
        Blocks that long at most: call it off the event loop."""
        since = self._sampling_since  # None: no sample runs, or one is only starting
        ran = 0.0 if since is None else self._clock() - since
        if not self._sampling.acquire(timeout=max(0.0, CLOSE_WAIT_S - ran)):
            log.warning("A device sample is still running; exiting without closing %s.", self.inventory.kind)
            return
        # Held from now on: a refresh() coming later takes no sample of the closed inventory.
        self.inventory.close()


def in_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """fn() in a new daemon thread; the future, on the running loop, gets its result or exception.

    Unlike `asyncio.to_thread`, nothing waits for the thread at exit: for calls that may never
    return. Cancelling the future does not stop the thread.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
