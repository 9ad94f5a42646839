"""The inventory interface: what devices a host has and their state now."""

from __future__ import annotations

from abc import ABC, abstractmethod

from gpu_agent.protocol import DeviceInfo, DeviceSample


class Inventory(ABC):
    """A host's devices. `describe()` is static for the life of the agent; `sample()` is polled."""

    kind: str  # "nvml" or "cpu"

    @abstractmethod
    def describe(self) -> list[DeviceInfo]:
        """The devices as registered with the control plane.

        Called once per connection, to build the `register` frame.

        Returns:
            One entry per device, ordered by index.
        """

    @abstractmethod
    def sample(self) -> list[DeviceSample]:
        """Each device's memory, utilisation, temperature and power now.

        Called once per telemetry tick (every second). Aqua fields are left at their defaults;
        the agent fills them from the coordinator.

        Returns:
            One entry per device, ordered by index.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the device library; called once when the agent stops."""
