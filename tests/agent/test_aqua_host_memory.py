"""Host memory lent through Aqua ("cpu", "cpu0", "cpu:N" regions) is the CPU host's one device, but
on a GPU host it is no GPU's: it was counted as GPU 0's lent bytes (and GPU 0 shown a producer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_agent.aqua import AquaDeviceState, device_states
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory, NvmlInventory
from tests.agent.fake_nvml import FakeGpu, FakeNvml
from tests.agent.test_engines import fake_launcher

coordinator = pytest.importorskip("serving.aqua.coordinator", reason="serving.aqua.coordinator not present")


def _region(device: str, producer_id: str, consumer_id: str | None = None, allocated: int = 0) -> Any:
    return {
        "region_id": f"r-{device}-{producer_id}",
        "producer_id": producer_id,
        "device": device,
        "nbytes": 8 << 20,
        "allocated_bytes": allocated,
        "consumer_id": consumer_id,
    }


@pytest.mark.parametrize("device", ["cpu0", "cpu", "cpu:1"])
def test_on_a_gpu_host_host_memory_is_no_gpus_lent_memory(device: str) -> None:
    # The producer CLI lends host memory; deployment "1" on GPU 1 borrows 4 MiB of it.
    stats = {"regions": [_region(device, "producer-42", "1", 4 << 20)]}
    states = device_states(stats, {"1": 1}, host_memory_device=None)
    assert states == {1: AquaDeviceState("consumer", lent_bytes=0, borrowed_bytes=4 << 20, paired_with=None)}
    assert device_states(stats, {"1": 1}) == states  # None is the default


def test_host_memory_lent_by_an_engine_on_a_gpu_is_not_that_gpus() -> None:
    stats = {"regions": [_region("cpu0", "prod"), _region("cuda:0", "prod")]}
    states = device_states(stats, {"prod": 2}, host_memory_device=None)
    assert states == {2: AquaDeviceState("producer", lent_bytes=8 << 20, borrowed_bytes=0, paired_with=None)}


def test_on_a_cpu_host_host_memory_is_its_one_device() -> None:
    stats = {"regions": [_region("cpu0", "producer-42", "1", 4 << 20)]}
    states = device_states(stats, {"1": 0}, host_memory_device=0)
    assert states == {
        0: AquaDeviceState("consumer", lent_bytes=8 << 20, borrowed_bytes=4 << 20, paired_with=0)
    }


async def _lend_cpu0_and_sample(host: LocalHost) -> list[Any]:
    await host.start(lambda status: None)
    try:
        assert host.aqua is not None and host.aqua.socket_path is not None
        with coordinator.AquaClient(host.aqua.socket_path, name="producer-cli") as producer:
            producer.lease("producer-42", "cpu0", 1 << 20, {"kind": "test"})
            host.aqua.refresh()  # a telemetry tick
            devices, _ = host.sample()
    finally:
        await host.stop()
    return devices


@pytest.mark.asyncio
async def test_a_gpu_host_reports_no_gpu_lending_host_memory(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeGpu("00000000:17:00.0"), FakeGpu("00000000:18:00.0")])
    nvml.nvmlInit()
    host = LocalHost(NvmlInventory(nvml), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=2)
    devices = await _lend_cpu0_and_sample(host)
    assert [(d.index, d.aqua_role, d.lent_bytes) for d in devices] == [(0, "none", 0), (1, "none", 0)]


@pytest.mark.asyncio
async def test_a_cpu_host_reports_host_memory_lent_by_its_one_device(tmp_path: Path) -> None:
    host = LocalHost(CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=2)
    devices = await _lend_cpu0_and_sample(host)
    assert [(d.index, d.aqua_role, d.lent_bytes) for d in devices] == [(0, "producer", 1 << 20)]
