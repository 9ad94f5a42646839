"""`EngineManager`: converges the engines on this host to the control plane's desired list."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable

from gpu_agent.device_readings import in_daemon_thread
from gpu_agent.engines.command import safe_name
from gpu_agent.engines.leftovers import Leftover, end_recorded, records, write_record
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.logs import tail_lines
from gpu_agent.engines.ports import PortAllocator
from gpu_agent.engines.supervisor import EngineSupervisor, Launcher
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, EngineSample
from serving.backoff import Backoff

log = logging.getLogger(__name__)

LEFTOVER_RETRY_S = 10.0  # between two tries to end a leftover engine group that survived


class EngineManager:
    """One `EngineSupervisor` per desired deployment.

    `apply()` takes the complete desired list: new deployments start, missing ones stop, and a
    deployment whose spec changed is stopped and started again (the new supervisor reports the
    latencies the old one had not reported yet). A deployment naming a device this
    host does not have is reported failed at once and never started; like a postponed one (below),
    it is reported stopped once it leaves the desired list. Once `close()` (agent
    shutdown) has begun, `apply()` starts nothing: a desired list that arrives while the engines
    stop would otherwise start an engine that nothing stops.

    Engine groups a killed agent left that survive `end_leftovers()` (SIGKILL did not end them, or
    their record could not be read) are tried again, one every `leftover_retry_s`, while the agent
    runs (`retry_leftovers()`, each telemetry tick). Until one recorded on a device is gone, no
    engine starts on that device: such a deployment is reported failed, naming the group, and
    starts once the group is gone. So too a group of this agent's own engine runs that SIGKILL did
    not end (`_survived`): a deployment does not start again beside the group its last run left,
    and no other engine is given the port that group may still listen on until it is gone. The
    rule holds for every launch, not only the manager's starts: a deployment whose supervisor would
    launch its engine again (a crash restart, a restart command) while such a group, another
    deployment's, holds one of its devices is postponed the same way (`_refused`).
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
        leftover_retry_s: float | None = None,
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
        self._leftover_retry_s = LEFTOVER_RETRY_S if leftover_retry_s is None else leftover_retry_s
        self._leftovers: dict[str, Leftover] = {}  # record path -> a group that survived; next first
        self._retrying: asyncio.Task[None] | None = None  # the retry running
        self._retried_at = time.monotonic()  # when the last try ended
        self._desired: list[DeploymentSpec] = []
        self._postponed: set[str] = set()  # deployments waiting for a leftover to leave their devices
        # postponed: its supervisor (crashed, replaced, refused a launch), and its next start's `restarts`
        self._crashed: dict[str, tuple[EngineSupervisor, int]] = {}

    def log_path(self, deployment_id: str) -> str:
        return os.path.join(self.log_dir, f"{safe_name(deployment_id)}.log")

    async def end_leftovers(self) -> int:
        """End the engines a killed agent left running on this log dir (engines/leftovers.py);
        call it before the first `apply()`. The number found running; those that survive are
        tried again by `retry_leftovers()`."""
        found, left = await asyncio.to_thread(end_recorded, records(self.log_dir), self._grace_s)
        self._retried_at = time.monotonic()
        self._leftovers = {g.path: g for g in left}
        for g in left:
            log.error("%s survives; trying again every %g s.", _describe(g), self._leftover_retry_s)
        return found

    def leftovers(self) -> list[Leftover]:
        """The leftover engine groups that survived the tries so far."""
        return list(self._leftovers.values())

    def retry_leftovers(self) -> None:
        """Try again to end one leftover group that survived (the longest untried), in a daemon
        thread, unless one is being tried or the last try ended less than `leftover_retry_s` ago.
        Returns at once; called every telemetry tick."""
        if not self._leftovers or self._closed or (self._retrying is not None and not self._retrying.done()):
            return
        if time.monotonic() - self._retried_at < self._leftover_retry_s:
            return
        group = self._leftovers.pop(next(iter(self._leftovers)))
        self._leftovers[group.path] = group  # last in line, should it survive again
        self._retrying = asyncio.create_task(self._retry(group), name="engine-leftovers")

    async def _retry(self, group: Leftover) -> None:
        try:
            left = (await in_daemon_thread(lambda: end_recorded([group.path], self._grace_s), "leftovers"))[1]
        except Exception:
            log.exception("Trying again to end %s failed", _describe(group))
            left = [group]
        finally:
            self._retried_at = time.monotonic()
        if left:  # (a record unreadable for now does not unsay what an earlier read of it said)
            kept = group if left[0].pgid is None else dataclasses.replace(left[0], port=group.port)
            self._leftovers[group.path] = kept
            log.error("%s still survives; trying again in %g s.", _describe(kept), self._leftover_retry_s)
            return
        del self._leftovers[group.path]
        if group.port is not None:  # held since its engine run ended (`_survived`)
            self.ports.release(group.port)
        log.warning("%s is gone.", _describe(group))
        async with self._lock:
            if self._postponed and not self._closed:  # their devices may be free now
                await self._converge(self._desired)

    def _held_by(self, spec: DeploymentSpec) -> list[Leftover]:
        devices = set(spec.devices)
        return [g for g in self._leftovers.values() if g.devices is not None and g.devices & devices]

    async def apply(self, desired: list[DeploymentSpec]) -> None:
        """Converge to `desired` (the complete list for this host); ignored once closing."""
        async with self._lock:
            if self._closed:
                log.info("Agent stopping: ignoring a desired list of %d deployment(s).", len(desired))
                return
            self._desired = desired
            await self._converge(desired)

    async def _converge(self, desired: list[DeploymentSpec]) -> None:
        wanted = {d.id: d for d in desired}
        gone = [sup for dep_id, sup in self._engines.items() if wanted.get(dep_id) != sup.spec]
        for sup in gone:
            del self._engines[sup.spec.id]
        await asyncio.gather(*(sup.stop() for sup in gone))
        replaced = {sup.spec.id: sup for sup in gone if sup.spec.id in wanted}
        for dep_id in [d for d in self._rejected if d not in wanted]:
            del self._rejected[dep_id]  # reported failed (refused, postponed): now stopped
            self._on_status(DeploymentStatus(deployment_id=dep_id, state="stopped", ts=time.time()))
            self._postponed.discard(dep_id)
            self._crashed.pop(dep_id, None)
        for dep_id in sorted(wanted):
            spec = wanted[dep_id]
            if dep_id in self._engines:
                continue
            missing = [d for d in spec.devices if d not in self._devices]
            if missing:
                have = ", ".join(str(d) for d in sorted(self._devices))
                self._reject(spec, f"device(s) {missing} do not exist on this host (devices: {have})")
                continue
            held = self._held_by(spec)
            if held:  # it would fail for lack of the memory the group holds
                self._postponed.add(dep_id)
                if dep_id in replaced:  # (its latencies not reported yet go out once it starts)
                    self._crashed[dep_id] = (replaced[dep_id], replaced[dep_id].restarts + 1)
                why = "; ".join(map(_describe, held))
                self._reject(spec, f"not started on the memory held by {why}; it starts once that is gone")
                continue
            self._postponed.discard(dep_id)
            self._rejected.pop(dep_id, None)
            crashed, restarts = self._crashed.pop(dep_id, (None, 0))  # (its restart, counted as one)
            sup = self._start(spec, restarts if crashed is not None and crashed.spec == spec else 0)
            previous = replaced.get(dep_id, crashed)
            if previous is not None:  # its latencies not reported yet go out with the new engine's
                sup.adopt_unreported(previous)

    def _reject(self, spec: DeploymentSpec, error: str) -> None:
        status = DeploymentStatus(deployment_id=spec.id, state="failed", ts=time.time(), error=error)
        self._rejected[spec.id] = status
        log.error("Deployment %s rejected: %s", spec.id, status.error)
        self._on_status(status)

    def _survived(self, sup: EngineSupervisor, group: Leftover, error: str) -> bool:
        """A run of `sup` left its engine group after SIGKILL: the group is tried again as a killed
        agent's is, and the deployment, unless it is being stopped, is postponed until the group is
        gone (True: `sup` ends). The group's port stays held until then."""
        if group.pgid is not None:  # the retry goes by its record: one not written at the start
            write_record(group.path, group.pgid, sup.spec.id, list(sup.spec.devices))  # was "gone"
        self._leftovers[group.path] = group
        log.error("%s; trying again every %g s.", _describe(group), self._leftover_retry_s)
        if self._engines.get(sup.spec.id) is not sup:  # stopping (removed, replaced, agent closing)
            return False
        del self._engines[sup.spec.id]
        self._crashed[sup.spec.id] = (sup, sup.restarts + 1)
        self._postponed.add(sup.spec.id)
        why = f"not started again on the memory held by {_describe(group)}; it starts once that is gone"
        self._reject(sup.spec, f"{why}. Its last run: {error}")
        return True

    def _refused(self, sup: EngineSupervisor) -> bool:
        """Asked before each launch of `sup` (`before_launch`): True if it must not launch, so for
        a supervisor being stopped, and for one whose devices a group that survived SIGKILL holds
        (another deployment's run, `_survived`, or a killed agent's): that deployment is postponed
        as a start is, until the group is gone. Only a start was checked: a crash restart or a
        restart command launched the engine beside the group, which failed on the memory it holds,
        again and again. (A group of its own last run is `_survived`'s, before this is asked.)"""
        if self._engines.get(sup.spec.id) is not sup:  # stopping (removed, replaced, agent closing)
            return True
        held = self._held_by(sup.spec)
        if not held:
            return False
        del self._engines[sup.spec.id]
        self._crashed[sup.spec.id] = (sup, sup.restarts)  # (it counts the launch refused already)
        self._postponed.add(sup.spec.id)
        why = "; ".join(map(_describe, held))
        why = f"not started on the memory held by {why}; it starts once that is gone"
        self._reject(sup.spec, why if sup.error is None else f"{why}. Its last run: {sup.error}")
        return True

    def _start(self, spec: DeploymentSpec, restarts: int = 0) -> EngineSupervisor:
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
            on_survivor=lambda group, error: self._survived(sup, group, error),
            before_launch=lambda: self._refused(sup),
        )
        sup.restarts = restarts
        self._engines[spec.id] = sup
        log.info("Starting deployment %s (%s on devices %s).", spec.id, spec.model.name, spec.devices)
        sup.start()
        return sup

    async def restart(self, deployment_id: str) -> bool:
        """Restart one deployment's engine; False if it is not on this host. One postponed for a
        leftover group (`_postponed`) is on this host: it starts once that group is gone; so does
        one whose devices such a group holds now (its engine ends, and it is postponed)."""
        sup = self._engines.get(deployment_id)
        if sup is None:
            if deployment_id in self._postponed:
                log.info("Deployment %s starts once the engine group on its devices is gone.", deployment_id)
            return deployment_id in self._postponed
        if self._held_by(sup.spec):  # its supervisor ends before it launches (`_refused`)
            log.info("Deployment %s starts once the engine group on its devices is gone.", deployment_id)
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


def _describe(group: Leftover) -> str:
    if group.pgid is None:
        return f"the engine group recorded in {group.path} (unreadable)"
    devices = "unknown devices" if group.devices is None else f"device(s) {sorted(group.devices)}"
    return (
        f"process group {group.pgid} of deployment {group.deployment} on {devices}, still there after SIGKILL"
    )
