"""The CPU as a host's one device, for hosts without an NVIDIA driver (vLLM's CPU build)."""

from __future__ import annotations

import platform
import socket
import uuid

import psutil

from gpu_agent.inventory.base import Inventory
from gpu_agent.protocol import DeviceInfo, DeviceSample


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class CpuInventory(Inventory):
    """One device, index 0, kind "cpu": host memory from psutil, CPU utilisation."""

    kind = "cpu"

    def __init__(self) -> None:
        # A stable id per host, so the control plane sees the same device across restarts.
        self._uuid = f"CPU-{uuid.uuid5(uuid.NAMESPACE_DNS, socket.gethostname())}"
        self._name = f"{_cpu_name()} ({psutil.cpu_count(logical=True)} threads)"
        psutil.cpu_percent(interval=None)  # primes the counter; the next call measures from here

    def describe(self) -> list[DeviceInfo]:
        total = int(psutil.virtual_memory().total)
        return [DeviceInfo(0, self._uuid, self._name, "cpu", total, [])]

    def sample(self) -> list[DeviceSample]:
        vm = psutil.virtual_memory()
        used = int(vm.total - vm.available)
        return [
            DeviceSample(
                index=0,
                memory_used_bytes=used,
                memory_free_bytes=int(vm.available),
                utilization_pct=min(100.0, float(psutil.cpu_percent(interval=None))),
                temperature_c=_cpu_temperature(),
                power_w=None,
            )
        ]


def _cpu_temperature() -> float | None:
    sensors = getattr(psutil, "sensors_temperatures", None)
    if sensors is None:
        return None
    try:
        readings = sensors()
    except (OSError, RuntimeError):
        return None
    for name in ("coretemp", "k10temp", "cpu_thermal", "zenpower"):
        entries = readings.get(name)
        if entries:
            return float(max(e.current for e in entries))
    return None
