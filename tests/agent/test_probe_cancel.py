"""A `probe` frame with `cancel` stops the replay of its probe id on the agent: the replay's streams
close (the engine aborts their requests) and no more requests are sent, instead of the engine
being loaded for the rest of the workload after the profile job was cancelled."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_agent.probe import ProbeRunner
from gpu_agent.protocol import Probe, ProbeRequestSpec, parse_frame
from tests.aqua.conftest import wait_until
from tests.planning import test_probe_runner as fake
from tests.planning.test_probe_runner import FakeEngine

engine = fake.engine  # the stand-in streaming engine (fixture)


TBT_S = 0.1  # 100 tokens: a stream nobody closes runs for 10 s


@pytest.fixture
def slow_tokens() -> Iterator[None]:
    saved = fake.TBT_S
    fake.TBT_S = TBT_S
    yield
    fake.TBT_S = saved


def long_probe() -> Probe:
    # 20 requests, one every 0.25 s, 100 tokens each: about 15 s of load if nobody stops it
    requests = [ProbeRequestSpec(0.25 * k, 16, 100) for k in range(20)]
    return Probe("long", "7", 4.0, requests, timeout_s=60.0, seed=1)


@pytest.mark.usefixtures("slow_tokens")
def test_a_cancel_frame_stops_the_replay_and_closes_its_streams(engine: str, tmp_path: Path) -> None:
    spec = fake.spec(tmp_path)
    frame = long_probe()

    async def scenario() -> tuple[object, object, float]:
        replay = asyncio.create_task(ProbeRunner(engine, spec, sample_interval_s=0.05).run(frame))
        deadline = time.monotonic() + 30
        while FakeEngine.in_flight < 3:  # the first three requests are streaming
            assert time.monotonic() < deadline and not replay.done(), "the replay never got going"
            await asyncio.sleep(0.01)
        cancelled_at = time.monotonic()
        answer = await ProbeRunner(engine, spec).run(dataclasses.replace(frame, cancel=True))
        report = await asyncio.wait_for(replay, timeout=5)
        return report, answer, time.monotonic() - cancelled_at

    report, answer, took = asyncio.run(scenario())
    assert took < 2.0
    assert not report.ok and report.error is not None and "cancelled" in report.error  # type: ignore[attr-defined]
    assert not answer.ok and "stopped" in (answer.error or "")  # type: ignore[attr-defined]
    # The replay's own count: the stand-in may read a request sent just before the cancel later.
    counted = re.search(r"\((\d+) of 20 requests sent\)", report.error)  # type: ignore[attr-defined]
    assert counted is not None, report.error  # type: ignore[attr-defined]
    sent = int(counted[1])
    assert 3 <= sent < 10
    # The stand-in notices a closed stream at its next chunks; one left open would run for 9 s more.
    wait_until(lambda: FakeEngine.in_flight == 0, 5.0, "every stream it had open to be closed")
    time.sleep(0.6)  # more than two arrivals apart: a replay still running would send again
    assert len(FakeEngine.bodies) <= sent  # nothing more was sent


def test_a_cancel_for_no_running_replay_answers_and_sends_nothing(engine: str, tmp_path: Path) -> None:
    frame = dataclasses.replace(long_probe(), cancel=True)
    answer = asyncio.run(ProbeRunner(engine, fake.spec(tmp_path)).run(frame))
    assert not answer.ok and "no replay" in (answer.error or "")
    assert FakeEngine.bodies == []


def test_the_cancel_field_round_trips_and_defaults_to_false() -> None:
    frame = long_probe()
    assert frame.to_dict()["cancel"] is False
    again = parse_frame({**frame.to_dict(), "cancel": True}, "control_plane")
    assert isinstance(again, Probe) and again.cancel and again.probe_id == "long"
