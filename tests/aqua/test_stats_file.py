"""StatsFile: counters written off the caller's thread, and read_json waiting for them to settle."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from serving.aqua.offload.stats import StatsFile, read_json


def test_the_latest_snapshot_lands_and_close_writes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "counters.json"
    f = StatsFile(path, min_interval_s=0.2)
    for i in range(50):
        f.publish({"steps": i})
    assert read_json(path, settle_s=0.3) == {"steps": 49}
    f.publish({"steps": 50})
    f.publish({"steps": 51})  # likely still pending: the writer sleeps 0.2 s after a write
    f.close()
    assert read_json(path) == {"steps": 51}
    f.publish({"steps": 52})  # after close: written at once
    assert read_json(path) == {"steps": 52}
    assert sorted(p.name for p in path.parent.iterdir()) == ["counters.json"]  # no temp files left


def test_read_json_waits_for_a_write_that_comes_a_moment_later(tmp_path: Path) -> None:
    path = tmp_path / "late.json"
    f = StatsFile(path)
    threading.Timer(0.5, f.publish, args=({"saves": 3},)).start()
    assert read_json(path) == {}  # without settling: not there yet
    assert read_json(path, settle_s=0.6) == {"saves": 3}
    f.close()


def test_read_json_of_a_file_nobody_writes_returns_after_the_settle_time(tmp_path: Path) -> None:
    t0 = time.monotonic()
    assert read_json(tmp_path / "never.json", settle_s=0.2) == {}
    assert 0.2 <= time.monotonic() - t0 < 2.0


class _GateForOneThread:
    """A lock that makes the first acquire from `thread` wait until `opened` is set (it sets
    `arrived` first): holds a publish() at its lock while close() runs on another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.arrived, self.opened = threading.Event(), threading.Event()

    def __enter__(self) -> None:
        if threading.current_thread() is self.thread and not self.arrived.is_set():
            self.arrived.set()
            assert self.opened.wait(10)
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_publish_racing_close_on_another_thread_is_written(tmp_path: Path) -> None:
    path = tmp_path / "race.json"
    f = StatsFile(path)
    f.publish({"steps": 1})
    assert read_json(path, settle_s=0.2) == {"steps": 1}
    gate = _GateForOneThread()
    f._lock = gate  # type: ignore[assignment]
    gate.thread = threading.Thread(target=f.publish, args=({"steps": 2},))
    gate.thread.start()
    assert gate.arrived.wait(10)  # the publish is at its lock
    f.close()  # meanwhile, on this thread
    gate.opened.set()
    gate.thread.join(10)
    assert read_json(path) == {"steps": 2}
