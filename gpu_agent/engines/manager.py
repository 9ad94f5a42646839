"""`EngineManager`: converges the engines on this host to the control plane's desired list."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from gpu_agent.engines.command import safe_name
from gpu_agent.engines.leftovers import end_leftovers
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.logs import tail_lines
from gpu_agent.engines.ports import PortAllocator
from gpu_agent.engines.supervisor import EngineSupervisor, Launcher
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, EngineSample
from serving.backoff import Backoff

log = logging.getLogger(__name__)


class EngineManager:
    """One `EngineSupervisor` per desired deployment.

    `apply()` takes the complete desired list: new deployments start, missing ones stop, and a
    deployment whose spec changed is stopped and started again (the new supervisor reports the
    latencies the old one had not reported yet). A deployment naming a device this
    host does not have is reported failed at once and never started. Once `close()` (agent
    shutdown) has begun, `apply()` starts nothing: a desired list that arrives while the engines
    stop would otherwise start an engine that nothing stops.
    """

    def __init__(
        self,
        launcher: Launcher,
        log_dir: str,
        on_status: Callable[[DeploymentStatus], None],
        *,
        devices: set[int],
        backoff_factory: Callable[[str], Backoff] | None = None,
        health_timeout_s: float = 600.0,
        grace_s: float = 10.0,
        scrape_interval_s: float = 1.0,
        liveness: Liveness | None = None,
        ports: PortAllocator | None = None,
    ) -> None:
        self._launcher = launcher
        self.log_dir = log_dir
        self._on_status = on_status
        self._devices = devices
        self._backoff_factory = backoff_factory
        self._health_timeout_s = health_timeout_s
        self._grace_s = grace_s
        self._scrape_s = scrape_interval_s
        self._liveness = liveness
        self._engines: dict[str, EngineSupervisor] = {}  # deployment id -> supervisor
        self._rejected: dict[str, DeploymentStatus] = {}  # deployment id -> its failed status
        self._lock = asyncio.Lock()
        self._closed = False
        self.ports = ports or PortAllocator()  # shared: no two engines get one port

    def log_path(self, deployment_id: str) -> str:
        return os.path.join(self.log_dir, f"{safe_name(deployment_id)}.log")

    async def end_leftovers(self) -> int:
        """End the engines a killed agent left running on this log dir (engines/leftovers.py);
        call it before the first `apply()`. The number ended."""
        return await asyncio.to_thread(end_leftovers, self.log_dir, self._grace_s)

    async def apply(self, desired: list[DeploymentSpec]) -> None:
        """Converge to `desired` (the complete list for this host); ignored once closing."""
        async with self._lock:
            if self._closed:
                log.info("Agent stopping: ignoring a desired list of %d deployment(s).", len(desired))
                return
            await self._converge(desired)

    async def _converge(self, desired: list[DeploymentSpec]) -> None:
        wanted = {d.id: d for d in desired}
        gone = [sup for dep_id, sup in self._engines.items() if wanted.get(dep_id) != sup.spec]
        for sup in gone:
            del self._engines[sup.spec.id]
        await asyncio.gather(*(sup.stop() for sup in gone))
        replaced = {sup.spec.id: sup for sup in gone if sup.spec.id in wanted}
        for dep_id in [d for d in self._rejected if d not in wanted]:
            del self._rejected[dep_id]
        for dep_id in sorted(wanted):
            spec = wanted[dep_id]
            if dep_id in self._engines:
                continue
            missing = [d for d in spec.devices if d not in self._devices]
            if missing:
                self._reject(spec, missing)
                continue
            self._rejected.pop(dep_id, None)
            sup = self._start(spec)
            if dep_id in replaced:  # its latencies not reported yet go out with the new engine's
                sup.adopt_unreported(replaced[dep_id])

    def _reject(self, spec: DeploymentSpec, missing: list[int]) -> None:
        have = ", ".join(str(d) for d in sorted(self._devices))
        status = DeploymentStatus(
            deployment_id=spec.id,
            state="failed",
            ts=time.time(),
            error=f"device(s) {missing} do not exist on this host (devices: {have})",
        )
        self._rejected[spec.id] = status
        log.error("Deployment %s rejected: %s", spec.id, status.error)
        self._on_status(status)

    def _start(self, spec: DeploymentSpec) -> EngineSupervisor:
        backoff = self._backoff_factory(spec.id) if self._backoff_factory else None
        sup = EngineSupervisor(
            spec,
            self._launcher,
            self.log_path(spec.id),
            self._on_status,
            backoff=backoff,
            health_timeout_s=self._health_timeout_s,
            grace_s=self._grace_s,
            scrape_interval_s=self._scrape_s,
            liveness=self._liveness,
            ports=self.ports,
            group_record=os.path.join(self.log_dir, safe_name(spec.id)),  # + .<pgid>.group
        )
        self._engines[spec.id] = sup
        log.info("Starting deployment %s (%s on devices %s).", spec.id, spec.model.name, spec.devices)
        sup.start()
        return sup

    async def restart(self, deployment_id: str) -> bool:
        """Restart one deployment's engine; False if it is not on this host."""
        sup = self._engines.get(deployment_id)
        if sup is None:
            return False
        await sup.restart()
        return True

    def tail(self, deployment_id: str, n: int) -> list[str] | None:
        """Last `n` log lines; None if the deployment is unknown and has no log file."""
        path = self.log_path(deployment_id)
        if deployment_id not in self._engines and not os.path.exists(path):
            return None
        return tail_lines(path, n)

    def take_samples(self) -> list[EngineSample]:
        """Each deployment's engine since the previous call (`EngineSupervisor.take_sample`), for
        one telemetry frame; ordered by deployment id."""
        out = [self._engines[d].take_sample() for d in sorted(self._engines)]
        out += [EngineSample(deployment_id=d, state="failed") for d in sorted(self._rejected)]
        return sorted(out, key=lambda s: s.deployment_id)

    def statuses(self) -> list[DeploymentStatus]:
        """Every deployment's current status (re-sent to the control plane on reconnect)."""
        out = [sup.status() for sup in self._engines.values()] + list(self._rejected.values())
        return sorted(out, key=lambda s: s.deployment_id)

    def supervisor(self, deployment_id: str) -> EngineSupervisor | None:
        return self._engines.get(deployment_id)

    def deployments(self) -> dict[str, DeploymentSpec]:
        return {d: sup.spec for d, sup in self._engines.items()}

    async def close(self) -> None:
        """Stop every engine (agent shutdown); later `apply()` calls start nothing."""
        self._closed = True
        async with self._lock:
            await self._converge([])
