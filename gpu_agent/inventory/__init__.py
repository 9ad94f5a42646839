"""Device inventory: NVIDIA GPUs through NVML, or the CPU on hosts without a driver."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from gpu_agent.inventory.base import Inventory
from gpu_agent.inventory.cpu import CpuInventory
from gpu_agent.inventory.nvml import NvmlInventory

log = logging.getLogger(__name__)

__all__ = ["CpuInventory", "Inventory", "NvmlInventory", "detect_inventory"]

_warned_no_driver = False


def detect_inventory(nvml: Any = None, *, agent_name: str | None = None) -> Inventory:
    """NVML's GPUs if a driver answers, else the CPU as the one device (said once, in the log).

    Args:
        nvml: The pynvml module; imported when None (tests pass a stand-in).
        agent_name: The host name the agent registers as; part of the CPU device's uuid
            (`CpuInventory`), so that two agents on one machine report different devices.
    """
    global _warned_no_driver
    reason: str
    try:
        if nvml is None:
            import pynvml

            nvml = pynvml
        nvml.nvmlInit()
    except ImportError as exc:
        reason = f"nvidia-ml-py is not installed ({exc})"
    except (OSError, nvml.NVMLError) as exc:
        reason = f"NVML could not start: {exc}"
    else:
        try:
            if nvml.nvmlDeviceGetCount() > 0:
                return NvmlInventory(nvml)
            reason = "the NVIDIA driver reports no GPUs"
        except nvml.NVMLError as exc:  # a driver that starts but cannot list its GPUs
            reason = f"NVML could not list the GPUs: {exc}"
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if not _warned_no_driver:
        log.warning("No NVIDIA driver on this host (%s); reporting the CPU as its one device.", reason)
        _warned_no_driver = True
    return CpuInventory(agent_name)
