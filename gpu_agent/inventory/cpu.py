"""The CPU as a host's one device, for hosts without an NVIDIA driver (vLLM's CPU build)."""

from __future__ import annotations

import platform
import socket
import uuid

import psutil

from gpu_agent.inventory.base import Inventory
from gpu_agent.inventory.cgroup_memory import CGROUP_ROOT, SELF_CGROUP, cgroup_memory
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
    """One device, index 0, kind "cpu": host memory from psutil, or the container's cgroup memory
    limit when that is smaller (inventory/cgroup_memory.py), and CPU utilisation."""

    kind = "cpu"

    def __init__(
        self, agent_name: str | None = None, *, cgroup_root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP
    ) -> None:
        """
        Args:
            agent_name: The host name the agent registers as (its --name). It goes into the
                device's uuid, so that agents of different hosts on one machine report different
                devices (device uuids are unique in the control plane); None or the machine's own
                name: the machine's id alone, as before agents were named.
            cgroup_root: Where the cgroup filesystem is mounted (tests pass a directory of their own).
            self_cgroup: This process's cgroup memberships (/proc/self/cgroup).
        """
        self._cgroup = (cgroup_root, self_cgroup)
        self._uuid = cpu_uuid(agent_name)
        self._name = f"{_cpu_name()} ({psutil.cpu_count(logical=True)} threads)"
        psutil.cpu_percent(interval=None)  # primes the counter; the next call measures from here

    def _memory(self) -> tuple[int, int]:
        """(total, free) bytes: the machine's, or under the cgroup limit where that is smaller (a
        container limited to 8 GiB on a 512 GiB machine registered 512 GiB, and engines placed to
        fit that were OOM-killed)."""
        vm = psutil.virtual_memory()
        total, free = int(vm.total), int(vm.available)
        limited = cgroup_memory(*self._cgroup)
        if limited is not None:
            total = min(total, limited.limit_bytes)
            free = min(free, limited.free_bytes)
        return total, max(0, min(free, total))

    def describe(self) -> list[DeviceInfo]:
        total, _ = self._memory()
        return [DeviceInfo(0, self._uuid, self._name, "cpu", total, [])]

    def sample(self) -> list[DeviceSample]:
        total, free = self._memory()
        return [
            DeviceSample(
                index=0,
                memory_used_bytes=total - free,
                memory_free_bytes=free,
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
