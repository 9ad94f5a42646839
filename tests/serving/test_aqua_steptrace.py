"""benchmarks/aqua_steptrace.py's analysis takes a burst's slowest TTFT apart into the wait for the
step in flight, the steps until that request's first token, and the delivery to the client, from
a synthetic trace whose every figure is known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import aqua_steptrace as st

REPO = Path(__file__).resolve().parents[2]


def _sched(t0: float, ids: list[str], tok: int, exec_s: float) -> list[dict[str, Any]]:
    """One step: schedule() takes 1 ms, the step runs `exec_s`, update_from_output 1 ms."""
    sched = {"ev": "sched", "t0": t0, "t1": t0 + 0.001, "n": len(ids), "tok": tok, "ids": ids}
    sched.update({"new": [], "resumed": 0, "preempted": 0})
    upd = {"ev": "upd", "t0": t0 + 0.001 + exec_s, "t1": t0 + 0.002 + exec_s}
    return [sched, upd]


def _trace() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A long request decoding; two shorts submitted at t=100.000 reach the scheduler at 100.003,
    during a decode step that ends at 100.0055; then two prefill steps (one short each, 10 ms and
    12 ms) whose tokens reach the client 2 ms and 3 ms after each step's end."""
    events: list[dict[str, Any]] = []
    events += _sched(99.990, ["long-r0-0-ab"], 1, 0.004)  # 99.990 .. 99.996
    events += _sched(99.997, ["long-r0-0-ab"], 1, 0.0075)  # in flight: ends at 100.0055
    events += [
        {"ev": "add", "t": 100.003, "id": "short-r0-0-cd"},
        {"ev": "add", "t": 100.0031, "id": "short-r0-1-ef"},
    ]
    events += _sched(100.0065, ["short-r0-0-cd"], 20, 0.010)  # ends at 100.0175
    events += _sched(100.0185, ["short-r0-1-ef", "short-r0-0-cd"], 21, 0.012)  # ends at 100.0315
    events += _sched(100.0325, ["short-r0-1-ef", "short-r0-0-cd"], 2, 0.004)
    reqs = [
        {"id": "long-r0-0", "submit": 99.980, "first": 99.9985},
        {"id": "short-r0-0", "submit": 100.000, "first": 100.0195},
        {"id": "short-r0-1", "submit": 100.0002, "first": 100.0345},
    ]
    return events, reqs


def test_the_slowest_ttft_is_the_wait_plus_the_steps_plus_the_delivery() -> None:
    events, reqs = _trace()
    steps = st._steps(events)
    adds = [e for e in events if e["ev"] == "add"]
    burst = st._burst(steps, adds, reqs, "short-r0-")
    assert burst["to_scheduler_ms"] == pytest.approx(3.0)
    assert burst["in_flight_ms"] == pytest.approx(6.5)
    assert burst["steps_to_last_first_token"] == 2
    assert burst["those_steps_ms"] == pytest.approx(25.0)
    assert burst["delivery_ms"] == pytest.approx(3.0)
    # The parts add up to the slowest request's TTFT counted from the burst's first submission.
    slowest = 1e3 * (100.0345 - 100.000)
    assert burst["in_flight_ms"] + burst["those_steps_ms"] + burst["delivery_ms"] == pytest.approx(slowest)


def test_a_step_runs_from_its_schedule_to_its_update_and_the_host_time_is_the_rest() -> None:
    events, _ = _trace()
    steps = st._steps(events)
    assert [round(1e3 * s["exec"], 3) for s in steps] == [4.0, 7.5, 10.0, 12.0, 4.0]
    # schedule 1 ms + update 1 ms + the gap to the next schedule (1 ms after the first step, none
    # after the second)
    assert [round(1e3 * s["host"], 3) for s in steps[:2]] == [3.0, 2.0]


def test_traces_of_every_engine_process_are_read(tmp_path: Path) -> None:
    events, _ = _trace()
    base = tmp_path / "ours.jsonl"
    Path(f"{base}.100").write_text("".join(json.dumps(e) + "\n" for e in events[:4]))
    Path(f"{base}.200").write_text("".join(json.dumps(e) + "\n" for e in events[4:]))
    assert sorted(json.dumps(e) for e in st._load(str(base))) == sorted(json.dumps(e) for e in events)


def test_a_traces_folder_that_cannot_be_made_is_refused_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = subprocess.run(
        [sys.executable, "benchmarks/aqua_steptrace.py", "--quick", "--traces", str(blocker / "t")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and f"--traces: '{blocker / 't'}'" in out.stderr
    assert "Traceback" not in out.stderr
