"""`EngineSupervisor`: runs one deployment's engine process, keeps it up, scrapes its metrics.

Life of a deployment:
    starting --/health 200--> running --process exits--> failed --backoff--> starting ...
    starting --exits or health timeout--> failed (error = the engine's last log lines) --backoff--> ...
    running --/health unanswered (engines/liveness.py)--> failed (process ended) --backoff--> ...
    any --stop()--> stopped (SIGTERM to the process group, SIGKILL after `grace_s`)
Every run ends with its whole process group: workers the engine left behind when it died are ended
(engines/process_group.py) before the failure is reported and before a new engine starts, so that
no orphan keeps the devices' memory. The run's port (engines/ports.py) is held until then (a
group that SIGKILL did not end takes it to `on_survivor`, which releases it once the group is
gone); a status carries it only while the engine is starting or running. The group is ended once a
run: one a stop() or restart() left is `on_survivor`'s too, the run ending there (never watched on:
a stop() waited for as long as it answered /health). No launch, the first or a restart, that
`before_launch` refuses (another group holds the devices' memory): supervision ends there instead.
A `restart()` (operator command) terminates the process and starts it again at once, counted in
`restarts` like a crash restart but without the backoff (one that comes while the process is being
created ends that process as soon as it exists). Every state change is reported through
`on_status`. While running, /metrics is scraped every `scrape_interval_s`, and /health is probed
(`liveness`): a hung engine's process does not exit, so the exit watch alone kept it `running`.

Telemetry takes `take_sample()` once a tick: its latencies are those observed since the scrape the
previous take reported up to, so every observation is reported exactly once however the scrapes
and the ticks drift apart (a scrape every `scrape_interval_s` *plus* its own duration against ticks
on the wall clock). Reporting each scrape's own window instead sent a window twice when no scrape
fell between two ticks and lost one when two did.
A run that ends (crash, `restart()`, `stop()`) keeps what its scrapes saw since the last take
(`_unreported`); the next take adds it to its own window (the run's alone, its state that of the
take, when the bucket layouts differ: `metrics.combine`). A supervisor that replaces one for the
same deployment (a changed spec) takes over its predecessor's (`adopt_unreported`). Those of a
deployment that left this host are dropped: the control plane refuses samples for a deployment
that is not on the host.

An exception while building or launching the engine is a `failed` status with the error, never a
silently dead supervisor (which left the deployment `starting` for ever):
    starting --launcher raises--> failed --backoff--> starting ...
except a configuration error (`EngineConfigError`, e.g. `engine_options["seed"]` = "abc"). Trying
the same spec again cannot fix that, so it stays `failed` until the control plane sends a new spec
(a new supervisor) or an operator restarts it.

Engine output goes to `log_path`, rotated at each start (engines/logs.py) so that a crash loop
cannot fill the disk. The `error` of a failed status carries the log's last lines, bounded in bytes
(`ERROR_TAIL_BYTES`): it goes out in a frame, and is re-sent on every reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

import httpx

from gpu_agent.engines.command import EngineConfigError, LaunchSpec
from gpu_agent.engines.exec_guard import guarded
from gpu_agent.engines.leftovers import Leftover, record_path, remove_record, write_record
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.logs import LOG_BACKUPS, LOG_MAX_BYTES, cap_lines, rotate, tail_lines
from gpu_agent.engines.metrics import (
    EngineMetrics,
    Window,
    combine,
    connector_bytes,
    parse_metrics,
    since,
    with_latencies,
)
from gpu_agent.engines.ports import PortAllocator
from gpu_agent.engines.process_group import end_group, group_alive
from gpu_agent.protocol import (
    DeploymentSpec,
    DeploymentState,
    DeploymentStatus,
    EngineSample,
)
from serving.backoff import Backoff

log = logging.getLogger(__name__)

Launcher = Callable[[DeploymentSpec, int], LaunchSpec]
ERROR_LINES = 30
ERROR_TAIL_BYTES = 16 * 2**10  # of log lines in a failed status's `error`


class EngineSupervisor:
    """Supervises one deployment's engine until `stop()`."""

    def __init__(
        self,
        spec: DeploymentSpec,
        launcher: Launcher,
        log_path: str,
        on_status: Callable[[DeploymentStatus], None],
        *,
        backoff: Backoff | None = None,
        health_timeout_s: float = 600.0,
        grace_s: float = 10.0,
        scrape_interval_s: float = 1.0,
        liveness: Liveness | None = None,
        stable_s: float = 60.0,
        simulated: bool = False,
        log_max_bytes: int = LOG_MAX_BYTES,
        log_backups: int = LOG_BACKUPS,
        ports: PortAllocator | None = None,
        group_record: str | None = None,
        on_survivor: Callable[[Leftover, str], bool] | None = None,
        before_launch: Callable[[], bool] | None = None,
    ) -> None:
        """
        Args:
            spec: The deployment.
            launcher: Builds the engine's command; may raise EngineConfigError.
            log_path: The engine's log file.
            on_status: Called with every status change.
            backoff: Restart delays; default 1 s doubling to 60 s.
            health_timeout_s: How long the engine may take to answer /health.
            grace_s: SIGTERM-to-SIGKILL grace.
            scrape_interval_s: Seconds between /metrics scrapes.
            liveness: How a running engine's /health is probed; default every 10 s, failed after
                3 probes in a row got no 200 within 5 s; a starting engine's /health is asked
                the same way (one request bounded as a whole by its `timeout_s`, as a /metrics
                scrape is).
            stable_s: A run this long resets the backoff when it ends.
            simulated: Reported in statuses.
            log_max_bytes: At an engine start, a log file this big is rotated to `<log>.1`.
            log_backups: Rotated files kept.
            ports: Where engine ports come from; shared by a host's supervisors, so that no two
                engines are given one port.
            group_record: Where each run's engine process group is recorded, for an agent
                started after this one was killed to end it: `<group_record>.<pgid>.group`
                (engines/leftovers.py); None: nowhere.
            on_survivor: Told of a run's recorded group that SIGKILL did not end (its record kept),
                with the run's error; True: supervision ends there (no engine starts beside it).
                The group's port stays held in `ports`: it releases it once the group is gone.
            before_launch: Asked before each engine launch, the first and every restart; True: it
                must not launch (another group holds its devices' memory): supervision ends there.
        """
        self.spec = spec
        self._launcher = launcher
        self.log_path = log_path
        self._on_status = on_status
        self._backoff = backoff or Backoff(base_s=1.0, cap_s=60.0, seed=hash(spec.id) & 0xFFFF)
        self._health_timeout_s = health_timeout_s
        self._grace_s = grace_s
        self._scrape_s = scrape_interval_s
        self._liveness = liveness or Liveness()
        self._stable_s = stable_s
        self._simulated = simulated
        self._log_max_bytes = log_max_bytes
        self._log_backups = log_backups
        self._ports = ports or PortAllocator()
        self._group_record = group_record
        self._on_survivor = on_survivor
        self._before_launch = before_launch
        self._survivor: Leftover | None = None  # the last run's group, if SIGKILL did not end it
        self.state: DeploymentState = "starting"
        self.restarts = 0
        self.port: int | None = None
        self.error: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()  # this run's group was ended, as far as SIGKILL could (_terminate)
        self._stopping = asyncio.Event()
        self._restart_requested = False
        self._kick = asyncio.Event()
        self._ran_stable_since: float | None = None
        self._offload_stats: str | None = None
        self._metrics: EngineMetrics | None = None  # the latest scrape of this run
        self._gauges: EngineSample | None = None  # its gauges and counters (no latencies)
        self._taken: EngineMetrics | None = None  # the scrape the last take_sample() reported up to
        self._unreported: list[Window] = []  # ended runs' observations no take reported yet
        self._unreadable_metrics = False  # a scrape of this run could not be reported (said once)
        self._bad_offload_counter = False  # the connector's file held a bad count this run (said once)

    # ---- control ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start supervising (returns at once)."""
        self._task = asyncio.create_task(self._run(), name=f"engine-{self.spec.id}")

    async def stop(self) -> None:
        """Terminate the engine (SIGTERM, then SIGKILL after the grace period); report stopped."""
        self._stopping.set()
        await self._terminate()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._set_state("stopped", error=None)

    async def restart(self) -> None:
        """Restart the engine now (operator request)."""
        self._restart_requested = True
        self._kick.set()  # also cuts a pending backoff wait short
        await self._terminate()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    def status(self) -> DeploymentStatus:
        """The deployment now. The port only while a live engine is starting or running: a
        failed or stopped engine has no URL, and its port may soon be another engine's."""
        up = self.state in ("starting", "running") and self.pid is not None
        return DeploymentStatus(
            deployment_id=self.spec.id,
            state=self.state,
            ts=time.time(),
            error=self.error,
            restarts=self.restarts,
            port=self.port if up else None,
            simulated=self._simulated,
        )

    def take_sample(self) -> EngineSample:
        """The engine since the previous `take_sample()`, for one telemetry frame: latencies
        observed between the scrape that call reported up to and the latest one (a count of 0 when
        no scrape came in between), gauges and counters as of the latest scrape. Metrics only
        while running; the first take of an engine run covers it from its start. Latencies that
        ended runs observed after their last take are added (see the module docstring)."""
        gauges, current = self._gauges, self._metrics
        ended = self._unreported.pop(0) if self._unreported else None
        if self.state != "running" or gauges is None or current is None:
            bare = EngineSample(deployment_id=self.spec.id, state=self.state)
            return bare if ended is None else with_latencies(bare, ended)
        window = since(current, self._taken)
        if ended is not None:
            window, *later = combine(ended, window)
            if later:  # another bucket layout: the ended run alone, this one next time
                return with_latencies(gauges, window)
        self._taken = current
        return with_latencies(gauges, window)

    def adopt_unreported(self, predecessor: EngineSupervisor) -> None:
        """Report, with this engine's, what the stopped supervisor this one replaces (same
        deployment) had not reported yet."""
        self._unreported = predecessor._unreported + self._unreported
        predecessor._unreported = []

    def tail(self, n: int) -> list[str]:
        return tail_lines(self.log_path, n)

    # ---- supervision loop ---------------------------------------------------------------------

    def _set_state(self, state: DeploymentState, error: str | None) -> None:
        self.state, self.error = state, error
        self._on_status(self.status())

    async def _run(self) -> None:
        while not self._stopping.is_set():
            if self._before_launch is not None and self._before_launch():
                return  # (`restarts` counts the launch it did not make)
            retry = True
            try:
                error = await self._run_once()
            except EngineConfigError as exc:
                error, retry = f"bad engine configuration: {exc}", False
            except Exception as exc:  # report it: a dead supervisor would leave `starting` for ever
                log.exception("Launching deployment %s failed", self.spec.id)
                error = f"engine could not be launched: {type(exc).__name__}: {exc}"
            survivor, self._survivor = self._survivor, None
            if survivor is not None and self._on_survivor is not None and self._on_survivor(survivor, error):
                return
            if self._stopping.is_set():
                return
            if self._restart_requested:
                self._restart_requested = False
                self.restarts += 1
                continue
            up_since = self._ran_stable_since
            if up_since is not None and time.monotonic() - up_since >= self._stable_s:
                self._backoff.reset()  # it had been up a good while: this is a fresh failure
            self._set_state("failed", error)
            delay: float | None = None  # None: wait for a restart command or stop()
            if retry:
                delay = self._backoff.next_delay()
                log.warning("Deployment %s failed; restarting in %.1f s: %s", self.spec.id, delay, error)
            else:
                log.error(
                    "Deployment %s not started (until a new spec or a restart): %s", self.spec.id, error
                )
            self._kick.clear()
            waiters = [asyncio.ensure_future(e.wait()) for e in (self._stopping, self._kick)]
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            self._restart_requested = False
            if not self._stopping.is_set():
                self.restarts += 1

    async def _run_once(self) -> str:
        """Start the engine and supervise it until it exits; returns the error to report.

        Whatever happens, it returns (or raises) only once the engine's whole process group is
        gone: a retry must not run beside what is left of this run, nor reuse its port before.
        """
        self._ran_stable_since = None  # set once this run answers /health
        self._ended.clear()
        port = self._ports.acquire()
        try:
            return await self._launch_and_watch(port)
        finally:
            await self._terminate()
            if self._proc is not None and self._group_record is not None:
                pgid, path = self._proc.pid, record_path(self._group_record, self._proc.pid)
                if not group_alive(pgid):
                    remove_record(path)
                else:  # left after SIGKILL: its record stays, and its port while it may listen there
                    self._survivor = Leftover(path, pgid, self.spec.id, frozenset(self.spec.devices), port)
            self._proc = None  # its pid may be reused: never signal that group again
            self.port = None
            if self._survivor is None or self._on_survivor is None:  # (else on_survivor releases it)
                self._ports.release(port)
            self._keep_unreported()

    def _keep_unreported(self) -> None:
        """At the end of a run: keep what its scrapes saw since the last take reported up to
        (the next take reports it), then forget the run's scrapes."""
        if self._metrics is not None:
            window = {n: h for n, h in since(self._metrics, self._taken).items() if h.count > 0}
            if self._unreported:
                self._unreported[-1:] = combine(self._unreported[-1], window)
            elif window:
                self._unreported.append(window)
        self._metrics, self._gauges, self._taken = None, None, None

    async def _launch_and_watch(self, port: int) -> str:
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        launch = self._launcher(self.spec, port)
        self._offload_stats = launch.offload_stats
        if launch.offload_stats is not None:
            # Counters are "since the engine started": drop the previous process's file.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(launch.offload_stats)
        self.port = port  # (the previous run's scrapes were forgotten at its end: _keep_unreported)
        self._unreadable_metrics = self._bad_offload_counter = False
        try:
            rotate(self.log_path, self._log_max_bytes, self._log_backups)
        except OSError as exc:  # a log we cannot rotate must not keep the engine down
            log.warning("Could not rotate %s: %s", self.log_path, exc)
        with open(self.log_path, "ab") as logf:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            logf.write(f"=== {stamp} agent: starting engine on port {port}: {launch}\n".encode())
            logf.flush()
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    # Execs the engine so that it gets SIGTERM if the agent dies (see exec_guard.py).
                    *guarded(launch.argv),
                    env=launch.env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=logf,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # its own process group: vLLM spawns workers
                )
            except OSError as exc:
                return f"engine could not be started: {exc}"
        proc = self._proc
        if self._group_record is not None:
            write_record(
                record_path(self._group_record, proc.pid), proc.pid, self.spec.id, list(self.spec.devices)
            )
        if self._restart_requested or self._stopping.is_set():
            # restart() or stop() came while the process was being created, when it had nothing to
            # end: end this one now (`_run` then starts the next at once, or stops). An engine that
            # answered its first /health was otherwise supervised after stop() until it exited.
            await self._terminate()
        self._set_state("starting", error=None)
        base_url = launch.base_url(port)
        hung: str | None = None
        # trust_env=False: the engine is on this host; an HTTP(S)_PROXY of the environment (for
        # weights downloads) would take /health and /metrics to a proxy that cannot reach it.
        async with httpx.AsyncClient(base_url=base_url, timeout=5.0, trust_env=False) as http:
            healthy = await self._wait_healthy(proc, http)
            if healthy:
                self._ran_stable_since = time.monotonic()
                self._set_state("running", error=None)
                log.info(
                    "Deployment %s running at %s (engine log %s).", self.spec.id, base_url, self.log_path
                )
                hung = await self._watch_running(proc, http)
        if hung is not None:  # its process lives on: end it before the failure is reported
            await self._terminate()
            what = hung
        elif proc.returncode is None and self._ended.is_set():  # by stop() or restart(): on_survivor's
            what = f"engine {'restarted' if self._restart_requested else 'stopped'}; SIGKILL left its group"
        elif proc.returncode is None:  # health timeout
            await self._terminate()
            what = f"engine did not become healthy within {self._health_timeout_s:.0f} s"
        elif healthy:
            what = f"engine exited with code {proc.returncode}"
        else:
            what = f"engine exited with code {proc.returncode} while starting"
        lines = "\n".join(cap_lines(self.tail(ERROR_LINES), ERROR_TAIL_BYTES))
        return f"{what}; last log lines:\n{lines}"

    async def _wait_healthy(self, proc: asyncio.subprocess.Process, http: httpx.AsyncClient) -> bool:
        deadline = time.monotonic() + self._health_timeout_s
        exited = asyncio.ensure_future(proc.wait())
        try:
            while time.monotonic() < deadline:
                # Bounded as a whole, as the liveness probe is: httpx's timeout is per read, so an
                # engine that trickled its answer held this (and a stop() waiting for it) for long.
                if await self._liveness.probe(http) is None:
                    return True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.25):
                        await asyncio.shield(exited)
                if exited.done() or self._stopping.is_set() or self._ended.is_set():
                    return False
            return False
        finally:
            exited.cancel()

    async def _watch_running(self, proc: asyncio.subprocess.Process, http: httpx.AsyncClient) -> str | None:
        """Scrape /metrics until the process exits while probing /health; the liveness error if
        the engine stopped answering first (its process still there), else None. A group that a
        stop() or restart() ended is not watched on, should SIGKILL have left it (on_survivor's)."""
        scraping = asyncio.ensure_future(self._scrape_until_exit(proc, http))
        probing = asyncio.ensure_future(self._liveness.watch(http))
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            done, _ = await asyncio.wait((scraping, probing, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (scraping, probing, ended):
                task.cancel()
            await asyncio.gather(scraping, probing, ended, return_exceptions=True)
        if probing in done and proc.returncode is None:  # (an exit says more, should both come)
            return probing.result()
        if scraping in done:
            scraping.result()  # an unexpected error is raised, as before the probes ran beside it
        return None

    async def _scrape_until_exit(self, proc: asyncio.subprocess.Process, http: httpx.AsyncClient) -> None:
        exited = asyncio.ensure_future(proc.wait())
        try:
            while not exited.done():
                await self._scrape(http)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._scrape_s):
                        await asyncio.shield(exited)
        finally:
            exited.cancel()

    async def _scrape(self, http: httpx.AsyncClient) -> None:
        """Take the engine's /metrics. One that does not answer, or answers what no telemetry can
        carry (NaN or +Inf, a count beyond the protocol's range), is a scrape that failed: the last
        figures stand, and the engine, which may well be serving, is left alone."""
        try:  # bounded as a whole, as a probe is (a trickled answer held the exit watch and stop()),
            async with asyncio.timeout(self._liveness.timeout_s):  # not cut at the client's 5 s a read
                resp = await http.get("/metrics", timeout=self._liveness.timeout_s)
            resp.raise_for_status()
        except (httpx.HTTPError, TimeoutError) as exc:
            log.debug("Scraping %s failed: %s", self.spec.id, exc or type(exc).__name__)
            return
        try:
            current = parse_metrics(resp.text)
            gauges = EngineSample(
                deployment_id=self.spec.id,
                state="running",
                kv_cache_usage=current.kv_cache_usage,
                running=current.running,
                waiting=current.waiting,
                preemptions_total=current.preemptions_total,
                bytes_offloaded=max(current.bytes_offloaded, self._connector_offloaded_bytes()),
            )
        except ValueError as exc:  # (ProtocolError too: a figure out of the frame's range)
            (log.debug if self._unreadable_metrics else log.warning)(
                "Deployment %s: its engine's /metrics cannot be reported (%s); skipping such scrapes.",
                self.spec.id,
                exc,
            )
            self._unreadable_metrics = True
            return
        self._metrics, self._gauges = current, gauges

    def _connector_offloaded_bytes(self) -> int:
        """Bytes the Aqua connector's worker reports offloaded (0 without its counters file). A
        value that is no count the control plane stores (metrics.connector_bytes) is left out, with
        one WARNING per engine run: the control plane refused the host's whole frame every tick."""
        try:
            return 0 if self._offload_stats is None else connector_bytes(self._offload_stats)
        except ValueError as exc:
            if not self._bad_offload_counter:
                self._bad_offload_counter = True
                log.warning(
                    "Deployment %s: %s; leaving it out of telemetry for this engine run.", self.spec.id, exc
                )
            return 0

    async def _terminate(self) -> None:
        """End the engine's process group (SIGTERM, SIGKILL after the grace period), also what is
        left of it when the leader has already exited. Once a run: a group that SIGKILL left is
        `on_survivor`'s to try again, and the run ends on it (`_ended`), never watched on."""
        proc = self._proc
        if proc is not None and not self._ended.is_set():
            await end_group(proc, self._grace_s, self.spec.id)
            if self._proc is proc:
                self._ended.set()
