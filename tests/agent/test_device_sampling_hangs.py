"""An NVML call that blocks (a GPU in a bad state) while the agent runs: the agent's loop goes on,
the readings it reports age out to unknown, and sampling resumes once the call returns."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpu_agent.agent import Agent
from gpu_agent.device_readings import DeviceReadings
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory, NvmlInventory
from gpu_agent.protocol import DeviceSample
from serving.backoff import Backoff
from tests.agent.fake_nvml import FakeGpu, FakeNvml
from tests.agent.test_engines import fake_launcher
from tests.agent.ws_server import ControlPlaneStub, wait_for

INTERVAL_S = 0.2
MAX_AGE_S = 0.6
LATE_S = 0.2  # how much later than its interval a frame may come while NVML hangs
HANG_LIMIT_S = 5.0  # a hung call returns by itself after this, so a failing test ends
GIB = 2**30
Running = tuple[Agent, ControlPlaneStub, "HangingNvml", "asyncio.Task[None]"]
UNKNOWN = {"memory_used_bytes": 0, "memory_free_bytes": 0, "utilization_pct": None, "power_w": None}


class HangingNvml(FakeNvml):
    """FakeNvml whose memory query blocks on `release` once `hang()` is called; it counts the
    queries in flight (one per sample: the host has one GPU)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.release = threading.Event()
        self.release.set()
        self.stuck = threading.Event()  # a query is blocked now
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.queries = 0
        self.shutdown_in_flight: list[int] = []  # the queries in flight at each nvmlShutdown

    def nvmlShutdown(self) -> None:
        with self._lock:
            self.shutdown_in_flight.append(self.in_flight)
        super().nvmlShutdown()

    def hang(self) -> None:
        self.stuck.clear()
        self.release.clear()

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        with self._lock:
            self.queries += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if not self.release.is_set():
                self.stuck.set()
                self.release.wait(HANG_LIMIT_S)
            return super().nvmlDeviceGetMemoryInfo(h)
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest_asyncio.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    server = ControlPlaneStub()
    await server.start()
    nvml = HangingNvml([FakeGpu("00000000:17:00.0", used=GIB, util=40)])
    host = LocalHost(
        NvmlInventory(nvml),
        str(tmp_path),
        launcher=fake_launcher(tmp_path / "pids"),
        with_aqua=False,
        readings_max_age_s=MAX_AGE_S,
    )
    agent = Agent(
        host,
        server.url,
        "good-token",
        name="gpu-box",
        address="127.0.0.1",
        telemetry_interval_s=INTERVAL_S,
        backoff=Backoff(0.05, 0.2),
    )
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.link.connected and len(server.of_type("telemetry")) >= 2)
        yield agent, server, nvml, task
    finally:
        nvml.release.set()
        agent.stop()
        await asyncio.wait_for(task, 15)
        await server.stop()


async def _hang_for(nvml: HangingNvml, seconds: float) -> tuple[float, float]:
    """Make the next sample hang for `seconds`; the monotonic times it hung between."""
    nvml.hang()
    await wait_for(nvml.stuck.is_set, timeout=HANG_LIMIT_S * 2)
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    return t0, time.monotonic()


def _readings(frame: dict[str, Any]) -> dict[str, Any]:
    (device,) = frame["devices"]
    return {k: device[k] for k in UNKNOWN}


@pytest.mark.asyncio
async def test_it_keeps_sending_heartbeats_and_telemetry_while_an_nvml_call_hangs(
    running: Running,
) -> None:
    _, server, nvml, _ = running
    t0, t1 = await _hang_for(nvml, 1.5)
    for kind in ("telemetry", "heartbeat"):
        times = [t for t in server.times_of(kind) if t0 <= t <= t1]
        gaps = [b - a for a, b in itertools.pairwise([t0, *times, t1])]
        assert max(gaps) < INTERVAL_S + LATE_S, (kind, gaps)


@pytest.mark.asyncio
async def test_it_reports_the_last_sample_until_it_is_too_old_then_unknown_readings(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    _, server, nvml, _ = running
    good = _readings(server.of_type("telemetry")[-1])
    assert good["memory_used_bytes"] == GIB and good["utilization_pct"] == 40
    nvml.gpus[0].used, nvml.gpus[0].util = 3 * GIB, 90  # what the hung call will read
    with caplog.at_level(logging.WARNING, logger="gpu_agent.device_readings"):
        t0, t1 = await _hang_for(nvml, 1.5)
    while_stuck = [(t, _readings(f)) for t, f in server.frames if f["type"] == "telemetry" and t0 <= t <= t1]
    # Frames within MAX_AGE_S of the hung sample's start report the last good one, none after.
    assert all(r in (good, UNKNOWN) for _, r in while_stuck), while_stuck
    aged_out = [r for t, r in while_stuck if t > t0 + MAX_AGE_S + INTERVAL_S]
    assert len(aged_out) >= 2 and all(r == UNKNOWN for r in aged_out), while_stuck
    stuck_logs = [r for r in caplog.records if "No device sample" in r.getMessage()]
    assert len(stuck_logs) == 1 and stuck_logs[0].levelno == logging.WARNING


@pytest.mark.asyncio
async def test_it_reports_fresh_samples_again_once_the_call_returns_having_run_one_at_a_time(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    _, server, nvml, _ = running
    nvml.gpus[0].used, nvml.gpus[0].util = 3 * GIB, 90
    before = nvml.queries
    with caplog.at_level(logging.WARNING, logger="gpu_agent.device_readings"):
        await _hang_for(nvml, 1.5)
        while_hung = nvml.queries - before
        nvml.release.set()
        sent = len(server.frames)
        await wait_for(
            lambda: any(
                f["type"] == "telemetry" and _readings(f)["memory_used_bytes"] == 3 * GIB
                for _, f in server.frames[sent:]
            )
        )
        fresh = [f for _, f in server.frames[sent:] if f["type"] == "telemetry"][-1]
        assert _readings(fresh)["utilization_pct"] == 90
    # The ticks while it hung started no other sample; none ever ran beside another.
    assert while_hung == 1 and nvml.most_in_flight == 1
    recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert len(recovered) == 1 and recovered[0].levelno == logging.WARNING


@pytest.mark.asyncio
async def test_it_stops_without_waiting_for_a_hung_nvml_call(
    running: Running,
) -> None:
    agent, _, nvml, task = running
    await _hang_for(nvml, 0.1)
    t0 = time.monotonic()
    agent.stop()
    await asyncio.wait_for(task, HANG_LIMIT_S * 2)
    assert time.monotonic() - t0 < 1.0
    assert nvml.stuck.is_set() and not nvml.release.is_set()  # still hung ...
    assert nvml.shutdowns == 0  # ... so NVML was left as it was, not shut down behind the call


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_reports_a_sample_up_to_max_age_s_old_then_unknown_readings_logging_each_change_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    readings = DeviceReadings(CpuInventory(), max_age_s=5.0, clock=clock)
    unknown = [DeviceSample(index=0, memory_used_bytes=0, memory_free_bytes=0)]
    assert readings.latest() == unknown  # no sample yet
    readings.refresh()
    sample = readings.latest()
    assert sample != unknown and sample[0].memory_used_bytes > 0
    clock.now += 5.0
    assert readings.latest() == sample
    with caplog.at_level(logging.WARNING, logger="gpu_agent.device_readings"):
        clock.now += 0.1
        assert readings.latest() == readings.latest() == unknown
        assert [r.getMessage()[:17] for r in caplog.records] == ["No device sample "]
        readings.refresh()
        assert readings.latest() == readings.latest() != unknown
        assert len(caplog.records) == 2 and "recovered" in caplog.records[1].getMessage()


def test_it_refuses_a_max_age_that_is_not_positive_and_finite() -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_age_s"):
            DeviceReadings(CpuInventory(), max_age_s=bad)


@pytest.mark.asyncio
async def test_it_waits_for_a_sample_that_is_only_slow_then_shuts_nvml_down(
    running: Running,
) -> None:
    agent, _, nvml, task = running
    nvml.hang()
    await wait_for(nvml.stuck.is_set, timeout=HANG_LIMIT_S * 2)
    # The sample ends a moment after the stop: well within a sample's normal time.
    asyncio.get_running_loop().call_later(0.1, nvml.release.set)
    agent.stop()
    await asyncio.wait_for(task, HANG_LIMIT_S * 2)
    assert nvml.shutdowns == 1 and nvml.shutdown_in_flight == [0]  # once, after the sample ended


def test_close_waits_a_bounded_time_for_a_running_sample_then_shuts_nvml_down() -> None:
    nvml = HangingNvml([FakeGpu("00000000:17:00.0")])
    readings = DeviceReadings(NvmlInventory(nvml))
    queries = nvml.queries  # (the inventory read the GPU's memory size)
    nvml.hang()
    sampler = threading.Thread(target=readings.refresh)
    sampler.start()
    assert nvml.stuck.wait(HANG_LIMIT_S)
    closer = threading.Thread(target=readings.close)
    closer.start()
    closer.join(0.1)
    assert closer.is_alive() and nvml.shutdowns == 0  # waiting for the sample, not shut down beside it
    nvml.release.set()
    closer.join(HANG_LIMIT_S)
    sampler.join(HANG_LIMIT_S)
    assert nvml.shutdowns == 1 and nvml.shutdown_in_flight == [0]
    readings.refresh()  # closed: takes no sample of the shut-down NVML
    assert nvml.queries == queries + 1
