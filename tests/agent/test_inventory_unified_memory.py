"""A unified-memory GPU (NVIDIA GB10 in a DGX Spark, Grace Hopper in some modes): its driver
answers nvmlDeviceGetMemoryInfo with NOT_SUPPORTED, having no memory of its own. The agent
registers it (index, uuid, name) with its memory unknown: 0 bytes in `register`, 0 used and 0 free
in `telemetry`, as the protocol reports a reading it does not have, and its other readings as usual.
"""

from __future__ import annotations

import logging

import pytest

from gpu_agent.inventory import NvmlInventory
from gpu_agent.protocol import DeviceInfo, Register, Telemetry, dumps, loads
from tests.agent.fake_nvml import FakeGpu, FakeNvml

NOT_SUPPORTED, GPU_IS_LOST = 3, 15
GIB = 2**30


def gb10() -> FakeGpu:
    return FakeGpu("0000000F:01:00.0", name="NVIDIA GB10", errors={"nvmlDeviceGetMemoryInfo": NOT_SUPPORTED})


def test_it_registers_a_gpu_that_does_not_report_its_memory_with_memory_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory"):
        inv = NvmlInventory(FakeNvml([gb10()]))
        (sample,) = inv.sample()
        inv.sample()
    assert inv.describe() == [DeviceInfo(0, "GPU-0000000F:01:00.0", "NVIDIA GB10", "gpu", 0, [])]
    assert (sample.memory_used_bytes, sample.memory_free_bytes) == (0, 0)
    assert (sample.utilization_pct, sample.temperature_c, sample.power_w) == (40.0, 50.0, 250.0)
    (warning,) = caplog.records  # said once, as a warning: not an unreadable GPU
    assert warning.levelno == logging.WARNING
    assert "GPU 0" in warning.getMessage() and "NVIDIA GB10" in warning.getMessage()
    # The control plane's parser takes both frames.
    register = Register("spark", "10.0.0.5", "1", False, inv.describe())
    assert loads(dumps(register), sender="agent") == register
    telemetry = Telemetry(ts=1_700_000_000.0, devices=[sample])
    assert loads(dumps(telemetry), sender="agent") == telemetry


def test_gpus_that_report_their_memory_beside_it_are_described_and_sampled_as_before() -> None:
    h100 = FakeGpu("00000000:17:00.0", used=10 * GIB)
    inv = NvmlInventory(FakeNvml([h100, gb10()]))
    assert [(d.index, d.memory_total_bytes) for d in inv.describe()] == [(0, 80 * GIB), (1, 0)]
    s0, s1 = inv.sample()
    assert (s0.memory_used_bytes, s0.memory_free_bytes) == (10 * GIB, 70 * GIB)
    assert (s1.memory_used_bytes, s1.memory_free_bytes, s1.utilization_pct) == (0, 0, 40.0)


def test_a_gpu_whose_memory_query_fails_otherwise_is_still_left_out() -> None:
    lost = FakeGpu("00000000:17:00.0", errors={"nvmlDeviceGetMemoryInfo": GPU_IS_LOST})
    assert NvmlInventory(FakeNvml([lost])).describe() == []
