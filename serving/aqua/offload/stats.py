"""Offload counters, published as a small JSON file that tests, benchmarks and the agent scrape.

The engine's scheduler and worker publish through `StatsFile`, which writes on its own thread:
a write (mkdir, write, rename) cost 1-2 ms on the development machine's filesystem, and the
scheduler and the worker each published on every step that preempted or restored a request, so
a burst paid several milliseconds per step of file I/O in the engine's critical path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from serving.atomic_file import write_json_atomic

logger = logging.getLogger(__name__)


@dataclass
class OffloadStats:
    """Cumulative worker-side counters (bytes and seconds are totals since engine start)."""

    saves: int = 0
    loads: int = 0
    bytes_offloaded: int = 0
    bytes_restored: int = 0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    save_failures: int = 0
    load_failures: int = 0
    evacuations: int = 0
    bytes_evacuated: int = 0
    corrupted_restores: int = 0
    saves_by_tier: dict[str, int] = field(default_factory=dict)
    loads_by_tier: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StatsFile:
    """A counters file written off the caller's thread.

    `publish(data)` hands over a snapshot (the caller must not mutate it afterwards) and returns at
    once; a daemon thread writes the latest snapshot, at most once per `min_interval_s`, so the file
    lags the counters by at most about that. `close()` writes the last snapshot before returning.
    """

    def __init__(self, path: str | Path, min_interval_s: float = 0.1) -> None:
        self.path = Path(path)
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()  # guards _pending and _closed
        self._write_lock = threading.Lock()  # one write at a time, of the latest snapshot taken
        self._pending: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._closed = False
        self._failing = False  # the last write failed (logged once, until one succeeds)
        self._thread = threading.Thread(target=self._run, name=f"stats-{self.path.name}", daemon=True)
        self._thread.start()

    def publish(self, data: dict[str, Any]) -> None:
        # Queued and checked for close under one lock: a snapshot queued after close() took the
        # last one would never be written (the writer thread has ended).
        with self._lock:
            self._pending = data
            closed = self._closed
        if closed:
            self._flush()
        else:
            self._wake.set()

    def _flush(self) -> None:
        """Write the pending snapshot, if any. Taken and written under `_write_lock`, so writes
        never interleave and a snapshot is never overwritten by an older one."""
        with self._write_lock:
            data = self._take()
            if data is not None:
                self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        try:
            write_json_atomic(self.path, data, indent=None, sort_keys=True)
        except OSError as e:
            # Once per run of failures: an unwritable stats dir (read-only, full) would otherwise
            # add a line per write, ten a second under load, to an engine log that only rotates
            # when the engine starts.
            if self._failing:
                logger.debug("could not write %s: %s", self.path, e)
            else:
                logger.warning(
                    "could not write %s: %s (repeats are logged at DEBUG until a write succeeds)",
                    self.path,
                    e,
                )
            self._failing = True
            return
        if self._failing:
            logger.info("writing %s again", self.path)
            self._failing = False

    def _take(self) -> dict[str, Any] | None:
        with self._lock:
            data, self._pending = self._pending, None
        return data

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            self._flush()
            time.sleep(self.min_interval_s)

    def close(self) -> None:
        """Stop the writer thread and write what is pending (idempotent); a `publish` racing it
        is written too (by whichever of the two comes last)."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._flush()


def read_json(path: str | Path, settle_s: float = 0.0, timeout_s: float = 10.0) -> dict[str, Any]:
    """Read a counters file; a missing file reads as {}.

    With `settle_s`, first wait (up to `timeout_s`) until the file has not changed for `settle_s`
    seconds: a `StatsFile` writes the last counters of a run a moment after the run ends.
    """
    path = Path(path)
    start = time.monotonic()
    while settle_s > 0 and time.monotonic() - start < timeout_s:
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            age = time.monotonic() - start  # nothing written yet: give a first write settle_s
        if age >= settle_s:
            break
        time.sleep(max(0.01, settle_s - age))
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}
