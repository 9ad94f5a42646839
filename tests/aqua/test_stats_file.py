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
