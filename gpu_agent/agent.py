"""`Agent`: ties a `Host` to the control-plane link.

Every `telemetry_interval_s` (aligned to the wall clock) it samples the host and submits a
telemetry frame; deployment status changes are sent as they happen; on each (re)connect the link
sends `register` and every deployment's status. Frames from the control plane become host actions:
`desired_deployments` -> converge, `command` -> restart / log tail, `probe` -> replay a workload
against an engine and answer `probe_result` (gpu_agent/probe.py), `error` -> logged. When the
agent stops, replays still running are cancelled (their streams closed) and answered as failed
before the engines stop, and a probe that comes while they stop is answered as failed, not replayed.

The link is supervised: should `AgentLink.run()` ever end or raise while the agent is up (it is
built not to), the agent logs it at ERROR and starts it again after a backoff. It does not stop
instead, because stopping the agent stops every engine on the host: a fault in reporting would
become an outage of the models the host serves, which keep serving through the gateway while the
link is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

from gpu_agent import __version__
from gpu_agent.aqua import AquaHost
from gpu_agent.device_readings import DeviceReadings, in_daemon_thread
from gpu_agent.engines import EngineManager
from gpu_agent.engines.logs import LOG_TAIL_BYTES, cap_lines, unreadable_note
from gpu_agent.host import Host
from gpu_agent.link import AgentLink
from gpu_agent.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    MAX_HEARTBEAT_INTERVAL_S,
    Command,
    DeploymentStatus,
    DesiredDeployments,
    ErrorFrame,
    Frame,
    LogTail,
    Probe,
    ProbeReport,
    Register,
    Telemetry,
    without_nul,
)
from serving.backoff import Backoff, seed_for

log = logging.getLogger(__name__)

UNSENT_REPORTS = 16  # probe answers kept while disconnected (see Agent._unsent_reports)
PROBE_ANSWER_WAIT_S = 2.0  # at stop, for the cancelled replays' answers


class Agent:
    """One host's agent. `await run()` until `stop()`."""

    def __init__(
        self,
        host: Host,
        control_plane: str,
        token: str,
        *,
        name: str,
        address: str,
        telemetry_interval_s: float = 1.0,
        buffer_size: int = 300,
        backoff: Backoff | None = None,
    ) -> None:
        """
        Args:
            host: What this agent reports and controls.
            control_plane: Base URL of the control plane.
            token: The host token.
            name: Host name sent in `register`; also seeds the reconnect jitter, so that hosts
                which lose the control plane together do not all retry at the same moments.
            address: Where the gateway reaches this host's engines.
            telemetry_interval_s: Seconds between telemetry frames (and heartbeats), at most
                `MAX_HEARTBEAT_INTERVAL_S`; announced in `register`, the control plane waits a few
                missed beats of it before it calls the host stale.
            buffer_size: Telemetry frames kept while disconnected.
            backoff: Reconnect delays; default 0.5 s doubling to 30 s, seeded from `name`.

        Raises:
            ValueError: `telemetry_interval_s` is not in (0, MAX_HEARTBEAT_INTERVAL_S].
        """
        if not 0 < telemetry_interval_s <= MAX_HEARTBEAT_INTERVAL_S:  # also refuses nan
            raise ValueError(
                f"{telemetry_interval_s=} must be in (0, {MAX_HEARTBEAT_INTERVAL_S:g}] seconds: the control "
                "plane refuses a longer heartbeat interval"
            )
        self.host = host
        self.name = name
        self.address = address
        self._interval = telemetry_interval_s
        self.link = AgentLink(
            control_plane,
            token,
            hello=self._hello,
            on_frame=self._on_frame,
            heartbeat_interval_s=telemetry_interval_s,
            buffer_size=buffer_size,
            backoff=backoff or Backoff(seed=seed_for(name)),
        )
        self._link_restarts = Backoff(base_s=1.0, cap_s=30.0, seed=seed_for(name))
        self._statuses: asyncio.Queue[DeploymentStatus] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._probes: set[asyncio.Task[None]] = set()  # of those, the probe replays
        # Answers of replays that ended while the link was down: sent after the next `register`, so
        # a profile job still waiting for one (the agent was back within its grace) gets it instead
        # of waiting out the probe's timeout. Kept until `desired_deployments` comes, which the
        # control plane sends once it has stored a `register` (one it could not store, 4503, drops
        # the frames after it). Bounded: the oldest go first.
        self._unsent_reports: deque[ProbeReport] = deque(maxlen=UNSENT_REPORTS)
        self._aqua_refresh: asyncio.Task[object] | None = None  # the AquaHost.refresh() running
        self._readings_refresh: asyncio.Future[None] | None = None  # the DeviceReadings.refresh() running

    def register_frame(self) -> Register:
        return Register(
            host=self.name,
            address=self.address,
            agent_version=__version__,
            simulated=self.host.simulated,
            devices=self.host.describe(),
            # The default every control plane assumes goes unsaid (Register.to_dict leaves it out).
            heartbeat_interval_s=None if self._interval == DEFAULT_HEARTBEAT_INTERVAL_S else self._interval,
        )

    def _hello(self) -> list[Frame]:
        reports = list(self._unsent_reports)
        return [self.register_frame(), *map(_clean_status, self.host.statuses()), *reports]

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        await self.host.start(self._statuses.put_nowait)
        workers = [
            asyncio.create_task(self._keep_link_up(), name="link"),
            asyncio.create_task(self._telemetry_loop(), name="telemetry"),
            asyncio.create_task(self._status_loop(), name="statuses"),
        ]
        try:
            await self._stopping.wait()
        finally:
            log.info("Agent stopping: stopping engines.")
            # A replay would go on for the rest of its schedule (up to its timeout_s) against
            # engines that are stopping, holding the agent's exit; cancelling it closes its streams.
            for t in self._probes:
                t.cancel()
            if self._probes:  # each sends its answer (not ok) while the link is still up
                await asyncio.wait(set(self._probes), timeout=PROBE_ANSWER_WAIT_S)
            await self.host.stop()
            while not self._statuses.empty():
                await self.link.send(_clean_status(self._statuses.get_nowait()))
            self.link.stop()
            for t in workers[1:]:
                t.cancel()
            await asyncio.gather(*workers, *self._tasks, return_exceptions=True)

    async def _keep_link_up(self) -> None:
        """Run the link until the agent stops, starting it again if it ever ends or raises."""
        while True:
            started = time.monotonic()
            try:
                await self.link.run()
                error = None
            except Exception as exc:
                error = exc
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= 60.0:
                self._link_restarts.reset()
            delay = self._link_restarts.next_delay()
            log.error(
                "The control-plane link stopped unexpectedly (%s); restarting it in %.1f s.",
                "returned" if error is None else f"{type(error).__name__}: {error}",
                delay,
                exc_info=error,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            if self._stopping.is_set():
                return

    # ---- outgoing -----------------------------------------------------------------------------

    def telemetry_frame(self) -> Telemetry:
        devices, engines = self.host.sample()
        return Telemetry(ts=time.time(), devices=devices, engines=engines, simulated=self.host.simulated)

    async def _refresh_aqua(self) -> None:
        """Check the host's Aqua coordinator and take its stats in a worker thread, for the coming
        `telemetry_frame()` to report: a hung one takes seconds (probes, a restart), which must not
        hold up heartbeats, statuses and commands on this loop. Waits for it a quarter interval at
        most; a refresh still running then (or from an earlier tick) goes on, and this tick reports
        the last snapshot taken. Never two at once."""
        aqua = getattr(self.host, "aqua", None)
        if not isinstance(aqua, AquaHost):
            return
        if self._aqua_refresh is not None and not self._aqua_refresh.done():
            return
        self._aqua_refresh = refresh = asyncio.ensure_future(asyncio.to_thread(aqua.refresh))
        refresh.add_done_callback(_log_refresh_failure)
        await asyncio.wait({refresh}, timeout=self._interval / 4)

    async def _refresh_readings(self) -> None:
        """Sample the host's devices in a worker thread, for the coming `telemetry_frame()` to
        report: an NVML call on a GPU in a bad state may block for minutes, which must not stop
        heartbeats, statuses and commands on this loop (the control plane would call the host
        offline, and stop routing to its engines). Waits for it a quarter interval at most, like
        `_refresh_aqua()`; a sample still running then (or from an earlier tick) goes on, and this
        tick reports what `DeviceReadings.latest()` makes of the last one. Never two at once. The
        thread is a daemon one (`in_daemon_thread`): a stuck sample never holds the agent's exit."""
        readings = getattr(self.host, "readings", None)
        if not isinstance(readings, DeviceReadings):
            return
        if self._readings_refresh is not None and not self._readings_refresh.done():
            return
        self._readings_refresh = refresh = in_daemon_thread(readings.refresh, "device-sample")
        refresh.add_done_callback(_log_sample_failure)
        await asyncio.wait({refresh}, timeout=self._interval / 4)

    def _retry_leftovers(self) -> None:
        """Have the host's engine manager try again, in a thread, to end an engine group a killed
        agent left that survived the agent's start, or one of this agent's engine runs left after
        SIGKILL (`EngineManager.retry_leftovers`): it holds its GPUs' memory until it is gone.
        Never waited for."""
        engines = getattr(self.host, "engines", None)
        if isinstance(engines, EngineManager):
            try:
                engines.retry_leftovers()
            except Exception:
                log.exception("Retrying to end leftover engine groups failed")

    async def _telemetry_loop(self) -> None:
        while True:
            # Wake on the next multiple of the interval, so samples line up across hosts.
            now = time.time()
            await asyncio.sleep(self._interval - (now % self._interval))
            self._retry_leftovers()
            await asyncio.gather(self._refresh_aqua(), self._refresh_readings())
            try:
                frame = self.telemetry_frame()
            except Exception:
                log.exception("Sampling telemetry failed")
                continue
            self.link.submit_telemetry(frame)

    async def _status_loop(self) -> None:
        while True:
            status = await self._statuses.get()
            # Not buffered while disconnected: every status is re-sent on connect.
            await self.link.send(_clean_status(status))

    # ---- incoming -----------------------------------------------------------------------------

    async def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, DesiredDeployments):
            self._unsent_reports.clear()  # the register was stored: so were the answers after it
            # Converging may take seconds (stopping engines); keep reading frames meanwhile.
            self._spawn(self.host.apply(frame.deployments))
        elif isinstance(frame, Command):
            self._spawn(self._command(frame))
        elif isinstance(frame, Probe):
            if self._stopping.is_set():  # the replays were cancelled; a new one would hold the exit
                self._spawn(self._refuse_probe(frame))
            else:
                self._probes.add(self._spawn(self._probe(frame)))
        elif isinstance(frame, ErrorFrame):
            log.warning("Control plane reported an error: %s (%s)", frame.message, frame.code)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._probes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Handling a control-plane frame failed", exc_info=task.exception())

    async def _probe(self, frame: Probe) -> None:
        from gpu_agent.probe import ProbeRunner, failed, probe_summary

        endpoint = getattr(self.host, "engine_endpoint", None)
        target = endpoint(frame.deployment_id) if endpoint is not None else None
        if target is None:
            why = "is not running on this host" if endpoint is not None else "cannot be probed on this host"
            report = failed(frame, f"deployment {frame.deployment_id!r} {why} ({self.name})")
        else:
            log.info("Probing deployment %s at %.4g req/s.", frame.deployment_id, frame.rate)
            try:
                report = await ProbeRunner(*target).run(frame)
            except asyncio.CancelledError:
                if self._stopping.is_set():  # answered: its job fails now, not when the host is offline
                    await self.link.send(failed(frame, f"the agent stopped during the replay ({self.name})"))
                raise
            except Exception as exc:  # report, don't leave the control plane waiting
                log.exception("Probe %s failed", frame.probe_id)
                report = failed(frame, f"{type(exc).__name__}: {exc} ({self.name})")
        if report.error is not None and without_nul(report.error) != report.error:
            report = dataclasses.replace(report, error=without_nul(report.error))
        if target is not None:
            log.info("%s", probe_summary(report))
        if not await self.link.send(report):
            log.warning(
                "Probe %s ended while disconnected: its answer goes after the next register.", frame.probe_id
            )
            self._unsent_reports.append(report)

    async def _refuse_probe(self, frame: Probe) -> None:
        from gpu_agent.probe import failed

        await self.link.send(failed(frame, f"the agent is stopping ({self.name})"))

    async def _command(self, cmd: Command) -> None:
        if cmd.action == "restart_deployment":
            if await self.host.restart(cmd.deployment_id):
                return
        else:
            try:
                lines = self.host.tail(cmd.deployment_id, cmd.lines)
            except Exception as exc:  # answer anyway: the dashboard's log view waits for one
                log.exception("Reading the log of deployment %s failed", cmd.deployment_id)
                lines = [unreadable_note(exc)]
            if lines is not None:
                # Bounded: the control plane drops a message over 1 MiB, and the agent's link with it.
                lines = cap_lines([without_nul(line) for line in lines], LOG_TAIL_BYTES)
                await self.link.send(LogTail(cmd.deployment_id, lines, command_id=cmd.command_id))
                return
        await self.link.send(
            ErrorFrame(
                "unknown_deployment",
                f"command {cmd.command_id}: deployment {cmd.deployment_id!r} is not on this host",
                "deployment_id",
            )
        )


def _clean_status(status: DeploymentStatus) -> DeploymentStatus:
    """The status with NUL characters and lone surrogates of its `error` (an engine's last log
    lines, which may hold any byte; an exception's message naming a file by its undecodable bytes)
    replaced: the control plane refuses a string with either, and the status with it."""
    if status.error is None or without_nul(status.error) == status.error:
        return status
    return dataclasses.replace(status, error=without_nul(status.error))


def _log_refresh_failure(refresh: asyncio.Task[object]) -> None:
    if not refresh.cancelled() and refresh.exception() is not None:
        log.error("Checking the Aqua coordinator failed", exc_info=refresh.exception())


def _log_sample_failure(refresh: asyncio.Future[None]) -> None:
    if not refresh.cancelled() and refresh.exception() is not None:
        log.error("Sampling the devices failed", exc_info=refresh.exception())
