"""Faults of the host while the agent runs: a GPU that falls off the bus, an Aqua coordinator that
goes away. (Engine faults: test_runtime_faults_engines.py.)"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from gpu_agent.agent import Agent
from gpu_agent.aqua import AquaHost
from gpu_agent.host import LocalHost
from gpu_agent.inventory import NvmlInventory
from gpu_agent.protocol import DeviceSample, dumps, loads
from tests.agent.fake_nvml import FakeGpu, FakeNvml, NVMLError

NVML_ERROR_GPU_IS_LOST = 15


class FallingNvml(FakeNvml):
    """FakeNvml whose GPUs can fall off the bus: every query of a lost one raises GPU_IS_LOST."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.lost: set[str] = set()  # bus ids

    def _check(self, h: FakeGpu) -> None:
        if h.bus_id in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        self._check(h)
        return super().nvmlDeviceGetMemoryInfo(h)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self._check(h)
        return super().nvmlDeviceGetUtilizationRates(h)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._check(h)
        return super().nvmlDeviceGetTemperature(h, sensor)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._check(h)
        return super().nvmlDeviceGetPowerUsage(h)


def three_gpus() -> FallingNvml:
    return FallingNvml([FakeGpu(f"00000000:{bus}:00.0") for bus in ("17", "2A", "3D")])


def test_it_keeps_sampling_the_other_gpus_when_one_falls_off_the_bus(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = three_gpus()
    inventory = NvmlInventory(nvml)
    nvml.lost.add(nvml.gpus[1].bus_id)
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory.nvml"):
        first, second = inventory.sample(), inventory.sample()
    assert first == second
    assert [d.index for d in first] == [0, 1, 2]
    assert first[0].memory_used_bytes == 2**30 and first[2].utilization_pct == 40.0
    # The lost GPU has no memory to offer and no readings.
    assert first[1] == DeviceSample(index=1, memory_used_bytes=0, memory_free_bytes=0)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "GPU 1" in errors[0].getMessage()  # once, not every second

    nvml.lost.clear()  # it is back (e.g. after a reset)
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory.nvml"):
        back = inventory.sample()
    assert back[1].memory_used_bytes == 2**30 and back[1].temperature_c == 50.0
    assert "can be read again" in caplog.records[-1].getMessage()


@pytest.mark.asyncio
async def test_the_agent_sends_telemetry_for_the_other_gpus_when_one_is_lost(tmp_path: Path) -> None:
    nvml = three_gpus()
    host = LocalHost(NvmlInventory(nvml), str(tmp_path), with_aqua=False)
    agent = Agent(host, "http://127.0.0.1:9", "token", name="gpu-box", address="127.0.0.1")
    await host.start(lambda status: None)
    try:
        nvml.lost.add(nvml.gpus[2].bus_id)
        host.readings.refresh()  # a telemetry tick's sample (the agent takes it in a worker thread)
        frame = agent.telemetry_frame()
        assert [(d.index, d.memory_free_bytes) for d in frame.devices] == [
            (0, 79 * 2**30),
            (1, 79 * 2**30),
            (2, 0),
        ]
        assert loads(dumps(frame), sender="agent") == frame  # a valid frame for the control plane
    finally:
        await host.stop()


@pytest.mark.parametrize("fault", ["socket removed", "thread ended"])
def test_it_restarts_a_coordinator_that_went_away_and_its_clients_are_told(
    tmp_path: Path, fault: str
) -> None:
    coordinator = pytest.importorskip("serving.aqua.coordinator")
    path = str(tmp_path / "aqua.sock")
    host = AquaHost(path)
    assert host.start() is True
    try:
        producer = coordinator.AquaClient(path, name="prod")
        producer.lease("dep-prod", "cuda:0", 1 << 20, {"kind": "test"})
        host.refresh()  # a telemetry tick
        assert host.device_states({"dep-prod": 0})[0].lent_bytes == 1 << 20
        if fault == "socket removed":  # e.g. a clean-up of the state directory
            os.unlink(path)
        else:  # the coordinator's thread ends without the agent asking
            host._server.stop()

        host.refresh()  # the next telemetry tick
        states = host.device_states({"dep-prod": 0})

        assert states == {}  # a fresh coordinator: nothing is lent any more ...
        assert not producer.connected()  # ... and the producer was told its session is over
        assert host.socket_path == path
        again = coordinator.AquaClient(path, name="prod", connect_timeout=2.0)  # engines reach it
        again.lease("dep-prod", "cuda:0", 1 << 20, {"kind": "test"})
        host.refresh()
        assert host.device_states({"dep-prod": 0})[0].lent_bytes == 1 << 20
        assert host.restarts == 1
        producer.close()
        again.close()
    finally:
        host.stop()
    assert not os.path.exists(path)
