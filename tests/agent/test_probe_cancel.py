"""A `probe` frame with `cancel` stops the replay of its probe id on the agent: the replay's streams
close (the engine aborts their requests) and no more requests are sent, instead of the engine
being loaded for the rest of the workload after the profile job was cancelled."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_agent.probe import ProbeRunner
from gpu_agent.protocol import Probe, ProbeRequestSpec, parse_frame
from tests.planning import test_probe_runner as fake
from tests.planning.test_probe_runner import FakeEngine

engine = fake.engine  # the stand-in streaming engine (fixture)


@pytest.fixture
def slow_tokens() -> Iterator[None]:
    saved = fake.TBT_S
    fake.TBT_S = 0.05
    yield
    fake.TBT_S = saved


def long_probe() -> Probe:
    # 20 requests, one every 0.25 s, 100 tokens each: about 10 s of load if nobody stops it
    requests = [ProbeRequestSpec(0.25 * k, 16, 100) for k in range(20)]
    return Probe("long", "7", 4.0, requests, timeout_s=60.0, seed=1)


@pytest.mark.usefixtures("slow_tokens")
def test_a_cancel_frame_stops_the_replay_and_closes_its_streams(engine: str, tmp_path: Path) -> None:
    spec = fake.spec(tmp_path)
    frame = long_probe()

    async def scenario() -> tuple[object, object, float]:
        replay = asyncio.create_task(ProbeRunner(engine, spec, sample_interval_s=0.05).run(frame))
        await asyncio.sleep(0.8)
        cancelled_at = time.monotonic()
        answer = await ProbeRunner(engine, spec).run(dataclasses.replace(frame, cancel=True))
        report = await asyncio.wait_for(replay, timeout=5)
        return report, answer, time.monotonic() - cancelled_at

    report, answer, took = asyncio.run(scenario())
    assert took < 2.0
    assert not report.ok and report.error is not None and "cancelled" in report.error  # type: ignore[attr-defined]
    assert not answer.ok and "stopped" in (answer.error or "")  # type: ignore[attr-defined]
    sent = len(FakeEngine.bodies)
    assert 1 <= sent < 10
    time.sleep(0.6)  # the stand-in notices a closed stream at its next chunk
    assert FakeEngine.in_flight == 0  # every stream it had open was closed
    assert len(FakeEngine.bodies) == sent  # and nothing more was sent


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
