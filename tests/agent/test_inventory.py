"""Inventory: NVML mapping logic (against a stand-in NVML) and the CPU fallback."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pynvml
import pytest

import gpu_agent.inventory as inventory_pkg
from gpu_agent.inventory import CpuInventory, NvmlInventory, detect_inventory
from gpu_agent.inventory.nvml import normalize_bus_id
from gpu_agent.protocol import Telemetry, dumps, loads
from tests.agent.fake_nvml import FakeGpu, FakeNvml

GPU, SWITCH = 0, 2


def test_it_normalizes_bus_ids_of_both_widths() -> None:
    assert normalize_bus_id("00000000:17:00.0") == "0000:17:00.0"
    assert normalize_bus_id(b"0000:1A:00.0") == "0000:1a:00.0"


def test_it_maps_direct_nvlinks_to_local_indices_symmetrically() -> None:
    # 0<->1 (two links, reported with the legacy 4-digit domain), 2<->3 seen from one side only,
    # plus an inactive link and a link to a device that is not local.
    gpus = [
        FakeGpu("00000000:17:00.0", links=[("0000:2a:00.0", GPU), ("0000:2A:00.0", GPU), ("down", GPU)]),
        FakeGpu("00000000:2A:00.0", links=[("00000000:17:00.0", GPU)]),
        FakeGpu("00000000:3D:00.0", links=[("00000000:63:00.0", GPU), ("0000:99:00.0", GPU)]),
        FakeGpu("00000000:63:00.0", links=[]),
        FakeGpu("00000000:9B:00.0", links=None),  # no NVLink support at all
    ]
    inv = NvmlInventory(FakeNvml(gpus))
    peers = {d.index: d.nvlink_peers for d in inv.describe()}
    assert peers == {0: [1], 1: [0], 2: [3], 3: [2], 4: []}


def test_it_treats_gpus_on_an_nvswitch_as_all_to_all() -> None:
    gpus = [
        FakeGpu(f"00000000:{0x10 + i:02X}:00.0", links=[(f"0000:c{i % 2}:00.0", SWITCH)] * 4)
        for i in range(4)
    ]
    gpus.append(FakeGpu("00000000:F0:00.0", links=None))
    peers = [d.nvlink_peers for d in NvmlInventory(FakeNvml(gpus)).describe()]
    assert peers == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2], []]


def test_it_describes_and_samples_each_gpu() -> None:
    gpus = [
        FakeGpu("00000000:17:00.0", used=10 * 2**30, util=75, temp=66, milliwatts=312_500),
        FakeGpu("00000000:2A:00.0", name="NVIDIA H200", total=141 * 2**30, util=None),
    ]
    inv = NvmlInventory(FakeNvml(gpus))
    d0, d1 = inv.describe()
    assert (d0.kind, d0.name, d0.uuid, d0.memory_total_bytes) == (
        "gpu",
        "NVIDIA H100 80GB HBM3",
        "GPU-00000000:17:00.0",
        80 * 2**30,
    )
    assert (d1.name, d1.memory_total_bytes) == ("NVIDIA H200", 141 * 2**30)
    s0, s1 = inv.sample()
    assert (s0.memory_used_bytes, s0.memory_free_bytes) == (10 * 2**30, 70 * 2**30)
    assert (s0.utilization_pct, s0.temperature_c, s0.power_w) == (75.0, 66.0, 312.5)
    assert s1.utilization_pct is None  # NOT_SUPPORTED becomes "unknown", not 0


def test_it_falls_back_to_the_cpu_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(inventory_pkg, "_warned_no_driver", False)
    no_driver = FakeNvml([], init_error=9)
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory"):
        first = detect_inventory(no_driver)
        second = detect_inventory(no_driver)
    assert isinstance(first, CpuInventory) and isinstance(second, CpuInventory)
    warnings = [r for r in caplog.records if "No NVIDIA driver" in r.getMessage()]
    assert len(warnings) == 1


def test_it_uses_nvml_when_the_driver_answers() -> None:
    inv = detect_inventory(FakeNvml([FakeGpu("00000000:17:00.0")]))
    assert isinstance(inv, NvmlInventory)
    assert [d.kind for d in inv.describe()] == ["gpu"]


def test_it_falls_back_when_the_driver_lists_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory_pkg, "_warned_no_driver", True)
    nvml = FakeNvml([])
    assert isinstance(detect_inventory(nvml), CpuInventory)
    assert nvml.shutdowns == 1


def test_it_reports_the_cpu_with_host_memory(tmp_path: Path) -> None:
    # No cgroup limit (an empty cgroup root): the machine's memory.
    inv = CpuInventory(cgroup_root=str(tmp_path), self_cgroup=str(tmp_path / "none"))
    (dev,) = inv.describe()
    assert dev.kind == "cpu" and dev.index == 0 and dev.nvlink_peers == []
    assert dev.memory_total_bytes == psutil.virtual_memory().total
    (s,) = inv.sample()
    assert s.memory_used_bytes + s.memory_free_bytes == dev.memory_total_bytes
    assert s.utilization_pct is not None and 0 <= s.utilization_pct <= 100
    assert inv.describe()[0].uuid == dev.uuid  # stable


class InconsistentMemoryNvml(FakeNvml):
    """FakeNvml whose memory counts are NVML's unsigned 64-bit ones: a GPU with more memory used
    than it has gets a free count that wrapped past zero (a negative number read as unsigned)."""

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(total=h.total, used=h.used, free=(h.total - h.used) % 2**64)


def test_it_reports_a_wrapped_memory_count_as_none_so_the_frame_stays_valid() -> None:
    gpus = [
        FakeGpu("00000000:17:00.0", total=80 * 2**30, used=81 * 2**30, temp=61),  # used > total
        FakeGpu("00000000:2A:00.0"),
    ]
    inv = NvmlInventory(InconsistentMemoryNvml(gpus))
    bad, good = inv.sample()
    assert (bad.memory_used_bytes, bad.memory_free_bytes, bad.temperature_c) == (81 * 2**30, 0, 61.0)
    assert (good.memory_used_bytes, good.memory_free_bytes) == (2**30, 79 * 2**30)
    # The control plane takes the frame: no count past the signed 64-bit range it stores.
    frame = loads(dumps(Telemetry(ts=1_700_000_000.0, devices=[bad, good])), sender="agent")
    assert isinstance(frame, Telemetry) and frame.devices == [bad, good]


class UncountableNvml(FakeNvml):
    """A driver that starts (nvmlInit) but fails to list its GPUs, with pynvml's own errors."""

    NVMLError = pynvml.NVMLError

    def nvmlDeviceGetCount(self) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)


def test_it_falls_back_and_says_why_when_nvml_cannot_list_the_gpus(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(inventory_pkg, "_warned_no_driver", False)
    nvml = UncountableNvml([FakeGpu("00000000:17:00.0")])
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory"):
        inv = detect_inventory(nvml)
    assert isinstance(inv, CpuInventory)
    assert nvml.shutdowns == 1  # the nvmlInit that succeeded is undone
    (warning,) = [r.getMessage() for r in caplog.records if "No NVIDIA driver" in r.getMessage()]
    assert "NVML could not list the GPUs" in warning
