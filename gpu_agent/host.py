"""What the agent runs on: a real host (inventory + engines + Aqua) or a simulated one."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

from gpu_agent.aqua import AquaHost
from gpu_agent.device_readings import DeviceReadings
from gpu_agent.engines import EngineManager, VllmLauncher
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.supervisor import Launcher
from gpu_agent.inventory import Inventory
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, DeviceInfo, DeviceSample, EngineSample

log = logging.getLogger(__name__)

StatusCallback = Callable[[DeploymentStatus], None]


class Host(ABC):
    """The devices and engines one agent reports and controls."""

    simulated: bool = False

    @abstractmethod
    async def start(self, on_status: StatusCallback) -> None:
        """Prepare the host; called once before anything else.

        Args:
            on_status: Called (synchronously) with every deployment status change.
        """

    @abstractmethod
    def describe(self) -> list[DeviceInfo]:
        """The devices for the `register` frame; called on every (re)connect."""

    @abstractmethod
    def sample(self) -> tuple[list[DeviceSample], list[EngineSample]]:
        """Devices (with Aqua fields) and engines now; called every telemetry tick."""

    @abstractmethod
    async def apply(self, deployments: list[DeploymentSpec]) -> None:
        """Converge to the complete desired deployment list; called per `desired_deployments`."""

    @abstractmethod
    async def restart(self, deployment_id: str) -> bool:
        """Restart a deployment's engine; False if this host does not run it."""

    @abstractmethod
    def tail(self, deployment_id: str, lines: int) -> list[str] | None:
        """The last lines of a deployment's log; None if unknown."""

    @abstractmethod
    def statuses(self) -> list[DeploymentStatus]:
        """Every deployment's current status; re-sent on (re)connect."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop every engine and release resources; called once at shutdown."""


class LocalHost(Host):
    """This machine: NVML or CPU inventory, vLLM engine subprocesses, the Aqua coordinator."""

    def __init__(
        self,
        inventory: Inventory,
        state_dir: str,
        *,
        engine_bind: str = "127.0.0.1",
        launcher: Launcher | None = None,
        health_timeout_s: float = 600.0,
        grace_s: float = 10.0,
        liveness: Liveness | None = None,
        with_aqua: bool = True,
        readings_max_age_s: float = 5.0,
    ) -> None:
        """
        Args:
            inventory: The devices.
            state_dir: Where logs (logs/<deployment>.log), the Aqua socket (unless its path is too
                long: `gpu_agent.aqua_socket.coordinator_socket`) and counters live.
            engine_bind: Address engines listen on.
            launcher: Builds each engine's command; default: vLLM's OpenAI server.
            health_timeout_s: How long an engine may take to answer /health.
            grace_s: SIGTERM-to-SIGKILL grace when stopping an engine.
            liveness: How a running engine's /health is probed (default: engines/liveness.py's).
            with_aqua: Host the Aqua coordinator.
            readings_max_age_s: How old the last device sample may be and still be reported
                (`DeviceReadings`); older, devices report unknown readings.
        """
        self.inventory = inventory
        self.state_dir = state_dir
        self._bind = engine_bind
        self._launcher = launcher
        self._health_timeout_s = health_timeout_s
        self._grace_s = grace_s
        self._liveness = liveness
        self.aqua = AquaHost.for_state_dir(state_dir) if with_aqua else None
        self._devices = inventory.describe()
        # Sampled in a worker thread by the agent (NVML may block), read here each tick.
        self.readings = DeviceReadings(inventory, max_age_s=readings_max_age_s)
        self.engines: EngineManager | None = None

    async def start(self, on_status: StatusCallback) -> None:
        if self.aqua is not None:
            self.aqua.start()
        kind: Literal["gpu", "cpu"] = "gpu" if any(d.kind == "gpu" for d in self._devices) else "cpu"
        launcher = self._launcher or VllmLauncher(
            kind,
            bind=self._bind,
            aqua_socket=self.aqua.socket_path if self.aqua is not None else None,
            stats_dir=os.path.join(self.state_dir, "aqua-stats"),
        )
        self.engines = EngineManager(
            launcher,
            os.path.join(self.state_dir, "logs"),
            on_status,
            devices={d.index for d in self._devices},
            health_timeout_s=self._health_timeout_s,
            grace_s=self._grace_s,
            liveness=self._liveness,
        )
        # Before any engine starts: a killed agent's engines would hold their GPUs' memory.
        await self.engines.end_leftovers()

    def _manager(self) -> EngineManager:
        if self.engines is None:
            raise RuntimeError("LocalHost.start() has not been called")
        return self.engines

    def describe(self) -> list[DeviceInfo]:
        return list(self._devices)

    def sample(self) -> tuple[list[DeviceSample], list[EngineSample]]:
        """Devices as the last `readings.refresh()` left them (`DeviceReadings.latest()`: unknown
        readings before the first, or once the last is too old), and engines now; never blocks."""
        devices = self.readings.latest()
        manager = self._manager()
        if self.aqua is not None:
            engine_devices = {dep: spec.devices[0] for dep, spec in manager.deployments().items()}
            # Host memory is the CPU host's one device; on a GPU host it is no GPU's.
            host_memory = 0 if self.inventory.kind == "cpu" else None
            states = self.aqua.device_states(engine_devices, host_memory_device=host_memory)
            devices = [
                dataclasses.replace(
                    d,
                    aqua_role=s.role,
                    lent_bytes=s.lent_bytes,
                    borrowed_bytes=s.borrowed_bytes,
                    paired_with=s.paired_with,
                )
                if (s := states.get(d.index)) is not None
                else d
                for d in devices
            ]
        return devices, manager.take_samples()

    async def apply(self, deployments: list[DeploymentSpec]) -> None:
        await self._manager().apply(deployments)

    async def restart(self, deployment_id: str) -> bool:
        return await self._manager().restart(deployment_id)

    def tail(self, deployment_id: str, lines: int) -> list[str] | None:
        return self._manager().tail(deployment_id, lines)

    def statuses(self) -> list[DeploymentStatus]:
        return self._manager().statuses()

    def engine_endpoint(self, deployment_id: str) -> tuple[str, DeploymentSpec] | None:
        """The running engine's base URL and spec (for profiling probes); None if not running."""
        sup = self._manager().supervisor(deployment_id)
        if sup is None or sup.state != "running" or sup.port is None:
            return None
        host = "127.0.0.1" if self._bind in ("", "0.0.0.0", "::") else self._bind
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{sup.port}", sup.spec

    async def stop(self) -> None:
        if self.engines is not None:
            await self.engines.close()
        if self.aqua is not None:
            # Off the loop: a hung coordinator's thread is waited for (stop_timeout_s).
            await asyncio.to_thread(self.aqua.stop)
        # Off the loop: it waits a moment for a sample that is running (never for one stuck in NVML).
        await asyncio.to_thread(self.readings.close)
