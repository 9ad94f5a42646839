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


def cpu_uuid(agent_name: str | None = None) -> str:
    """The CPU device's uuid for the agent registering as `agent_name` on this machine: stable
    across restarts of that agent, different for every agent name on the machine, and the same as
    before agents were named for an agent named after the machine (the default)."""
    machine = socket.gethostname()
    key = machine if agent_name is None or agent_name == machine else f"{machine}/{agent_name}"
    return f"CPU-{uuid.uuid5(uuid.NAMESPACE_DNS, key)}"


class CpuInventory(Inventory):
    """One device, index 0, kind "cpu": host memory from psutil, CPU utilisation."""

    kind = "cpu"

    def __init__(self, agent_name: str | None = None) -> None:
        """
        Args:
            agent_name: The host name the agent registers as (its --name). It goes into the
                device's uuid, so that agents of different hosts on one machine report different
                devices (device uuids are unique in the control plane); None or the machine's own
                name: the machine's id alone, as before agents were named.
        """
        self._uuid = cpu_uuid(agent_name)
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
