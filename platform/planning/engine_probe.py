"""`AgentEngineProbe`: serving.profiler's EngineProbe for a deployment served by a GPU agent.

Each measurement crosses three processes: the profiling worker writes a `ProbeRequest` row holding
a `probe` frame; the ASGI process that holds the host agent's websocket claims the row and sends the
frame (planning/relay.py, polled by the agent's connection); the agent replays the requests against
its engine (gpu_agent/probe.py) and answers with `probe_result`, which that ASGI process stores on
the row; the worker polls the row until it is answered. The database is the only thing the worker
and the ASGI process share in every set-up (the embedded in-memory channel layer does not cross
processes), so this works the same with SQLite and the in-memory layer as with PostgreSQL and Redis.

measure(rate) replays `WorkloadSpec.requests(rate)`; measure_burst(rate, factor) replays
`WorkloadSpec.burst_requests(rate, factor)` on the engine and reports the agent's peak KV demand (KV
in use plus the prompts of requests waiting for their first token). The agent's client-side timings
of engine steps come back as cost-model samples, so the profile carries a fitted CostModel when they
determine one (its `fit_error` says why not otherwise).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from agents.models import AgentLink
from deployments.models import Deployment, DesiredState, ObservedState
from django.conf import settings
from django.utils import timezone
from inventory.models import Host, HostStatus
from registry.models import ServedModel

from gpu_agent.protocol import Probe, ProbeRequestSpec
from planning.models import ProbeRequest, ProbeStatus
from serving.profiler import (
    BurstResult,
    EngineProbe,
    ProbeResult,
    ProfilingCancelled,
    ProfilingError,
    WorkloadSpec,
)
from serving.workload.request import Request

# Seconds the worker waits beyond the replay's own timeout for the relay and the answer.
RELAY_MARGIN_S = 60.0


def _seconds(value: Any) -> float:
    """A percentile from a probe_result: null means infinitely late."""
    return math.inf if value is None else float(value)


def _samples(raw: Any) -> tuple[tuple[tuple[int, ...], float], ...]:
    """A probe_result's iteration samples as the profiler's (composition, seconds) pairs."""
    return tuple((tuple(s["lens"]), float(s["seconds"])) for s in raw or ())


def running_deployment(model: ServedModel, deployment_id: int | None = None) -> Deployment:
    """The deployment an engine profile of `model` probes: `deployment_id`, or the model's first
    running one on a real host. Checked when the job is posted (jobs.kinds.profile) and again when
    it runs.

    A simulated host's agent has no engine to replay requests against (it answers every probe
    "cannot be probed on this host"), so its deployments are never probed.

    Raises:
        ProfilingError: no such deployment of the model, it is not running, or its host is
            simulated.
    """
    running = Deployment.objects.filter(
        model=model, desired_state=DesiredState.RUNNING, observed_state=ObservedState.RUNNING
    ).select_related("host", "model")
    if deployment_id is not None:
        # A pk lookup: an id beyond the column's range finds nothing (Django), it does not overflow.
        deployment = running.filter(pk=deployment_id).first()
        if deployment is None:
            raise ProfilingError(
                f"deployment {deployment_id} is not a running deployment of model {model.name!r}"
            )
        if deployment.host.simulated:
            raise ProfilingError(
                f"deployment {deployment_id} runs on simulated host {deployment.host.name!r}, which "
                "has no engine to probe (profile a deployment on a real host, or use the simulator "
                "backend)"
            )
        return deployment
    deployment = running.filter(host__simulated=False).order_by("pk").first()
    if deployment is None:
        simulated = running.exists()
        raise ProfilingError(
            f"model {model.name!r} has no running deployment "
            f"{'on a real host ' if simulated else ''}to profile (deploy it"
            f"{' on a host with an engine' if simulated else ''}, or use the simulator backend)"
        )
    return deployment


class AgentEngineProbe(EngineProbe):
    """Probes one deployment's engine through its host's agent (module docstring)."""

    def __init__(
        self,
        deployment: Deployment,
        workload: WorkloadSpec,
        *,
        job_id: int | None = None,
        should_cancel: Callable[[], bool] | None = None,
        timeout_s: float = 600.0,
        poll_s: float = 0.2,
        disconnect_grace_s: float | None = None,
    ) -> None:
        """
        Args:
            deployment: A running deployment of the model (its host's agent replays the workload).
            workload: The workload (the same one the profiler records).
            job_id: The profile job, recorded on each ProbeRequest.
            should_cancel: Polled while waiting for an answer.
            timeout_s: The longest one replay may take on the agent.
            poll_s: Seconds between reads of the ProbeRequest row.
            disconnect_grace_s: How long the host's agent may stay disconnected while a probe
                waits for its answer (default: HOST_OFFLINE_AFTER_S, when its host counts as
                offline). An agent sends a `probe_result` only over a live connection: one that
                comes back in time may still answer, one that does not never will.
        """
        self.deployment = deployment
        self.workload = workload
        self.job_id = job_id
        self.should_cancel = should_cancel or (lambda: False)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.disconnect_grace_s = (
            float(settings.HOST_OFFLINE_AFTER_S) if disconnect_grace_s is None else disconnect_grace_s
        )
        self._kv_bytes_per_token = 0

    @classmethod
    def for_model(
        cls, model: ServedModel, workload: WorkloadSpec, *, deployment_id: int | None = None, **kw: Any
    ) -> AgentEngineProbe:
        """A probe of `deployment_id` (or of the model's first running deployment on a real host).

        Raises:
            ProfilingError: see `running_deployment`.
        """
        return cls(running_deployment(model, deployment_id), workload, **kw)

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes_per_token

    def measure(self, rate: float) -> ProbeResult:
        """One rate probe. One whose requests arrive over more than ``timeout_s`` is refused before
        anything is sent: the agent would stop it with requests never sent, which count as missing
        their SLO, so the rate would be judged too high whatever the engine can do (a 500-request
        probe at 0.25 req/s needs 2000 s)."""
        requests = self.workload.requests(rate)
        span = max((r.arrival for r in requests), default=0.0)
        if span >= self.timeout_s:
            raise ProfilingError(
                f"a probe at {rate:.4g} req/s sends its {len(requests)} requests over {span:.0f} s, "
                f"longer than probe_timeout_s ({self.timeout_s:g} s): raise probe_timeout_s, lower "
                f"workload.num_requests or raise min_rate ({self._where()})"
            )
        report = self._replay(rate, requests)
        return ProbeResult(
            rate=rate,
            ttft_p99_s=_seconds(report["ttft_p99_s"]),
            tbt_p99_s=_seconds(report["tbt_p99_s"]),
            ttft_p50_s=_seconds(report["ttft_p50_s"]),
            tbt_p50_s=_seconds(report["tbt_p50_s"]),
            num_requests=report["num_requests"],
            finished=report["finished"],
            kv_capacity_bytes=report["kv_capacity_bytes"],
            peak_kv_used_bytes=report["peak_kv_used_bytes"],
            prefill_samples=_samples(report.get("prefill_samples")),
            decode_samples=_samples(report.get("decode_samples")),
        )

    def measure_burst(self, rate: float, factor: float) -> BurstResult:
        """The KV demand of a burst. Only the burst must fit in ``timeout_s`` (the replay is cut
        there; the rest of its window is background load): refused before anything is sent when
        the burst would end after it."""
        w = self.workload
        burst_end = (w.burst_window_s(rate) + w.burst_duration_s) / 2
        if burst_end >= self.timeout_s:
            raise ProfilingError(
                f"the {factor:g}x burst probe at {rate:.4g} req/s bursts until {burst_end:.0f} s, after "
                f"probe_timeout_s ({self.timeout_s:g} s): raise probe_timeout_s or lower "
                f"workload.burst_duration_s or workload.num_requests ({self._where()})"
            )
        report = self._replay(rate, w.burst_requests(rate, factor))
        return BurstResult(rate, factor, report["peak_kv_demand_bytes"], report["kv_capacity_bytes"])

    def _where(self) -> str:
        d = self.deployment
        return f"deployment {d.pk} of model {d.model.name!r} on host {d.host.name!r}"

    def _replay(self, rate: float, requests: list[Request]) -> dict[str, Any]:
        """Send one `probe` through the relay and wait for its `probe_result` (a dict)."""
        link = AgentLink.objects.filter(host=self.deployment.host).first()
        if link is None or not link.connected:
            raise ProfilingError(
                f"the agent of host {self.deployment.host.name!r} is not connected ({self._where()})"
            )
        frame = Probe(
            probe_id=uuid.uuid4().hex,
            deployment_id=str(self.deployment.pk),
            rate=rate,
            requests=[ProbeRequestSpec(r.arrival, r.prompt_tokens, r.output_tokens) for r in requests],
            timeout_s=self.timeout_s,
            seed=self.workload.seed,
        )
        row = ProbeRequest.objects.create(
            probe_id=frame.probe_id, host=self.deployment.host, job_id=self.job_id, frame=frame.to_dict()
        )
        deadline = time.monotonic() + self.timeout_s + RELAY_MARGIN_S
        away_since: float | None = None  # when this worker first saw the agent disconnected
        while True:
            try:
                row.refresh_from_db(fields=["status", "result", "error"])
            except ProbeRequest.DoesNotExist:  # its host was deleted (the row goes with it)
                raise ProfilingError(
                    f"host {self.deployment.host.name!r} was deleted while probing {self._where()} "
                    f"at {rate:.4g} req/s"
                ) from None
            if row.status == ProbeStatus.DONE and row.result is not None:
                break
            if row.status == ProbeStatus.FAILED:
                raise ProfilingError(f"probing {self._where()} at {rate:.4g} req/s failed: {row.error}")
            if self.should_cancel():
                self._close(row, ProbeStatus.CANCELLED, "the profile job was cancelled")
                raise ProfilingCancelled(f"cancelled while probing {self._where()}")
            away_since = self._agent_away_since(away_since)
            if away_since is not None and time.monotonic() - away_since > self.disconnect_grace_s:
                self._close(row, ProbeStatus.FAILED, "its agent disconnected")
                raise ProfilingError(
                    f"the agent of host {self.deployment.host.name!r} disconnected while probing "
                    f"{self._where()} at {rate:.4g} req/s and did not come back within "
                    f"{self.disconnect_grace_s:g} s; its answer is lost: run the profile job again "
                    "once the agent is connected"
                )
            if time.monotonic() > deadline:
                self._close(row, ProbeStatus.FAILED, "no answer in time")
                raise ProfilingError(
                    f"no probe result from {self._where()} at {rate:.4g} req/s within "
                    f"{self.timeout_s + RELAY_MARGIN_S:.0f} s (is its agent connected?)"
                )
            time.sleep(self.poll_s)
        report: dict[str, Any] = row.result
        self._kv_bytes_per_token = int(report.get("kv_bytes_per_token") or self._kv_bytes_per_token)
        return report

    def _agent_away_since(self, since: float | None) -> float | None:
        """None while the host's agent is connected; else when it was first seen away (``since``,
        or now). Timed by this worker's clock, not the link's ``disconnected_at``, which another
        machine's clock wrote. An offline host's agent counts as away even if its link still says
        connected: the ASGI process that held the link died without marking it, and the liveness
        sweep found the host silent for HOST_OFFLINE_AFTER_S."""
        seen = Host.objects.filter(pk=self.deployment.host_id).values_list("status", "agent_link__connected")
        status, connected = seen.first() or (HostStatus.OFFLINE, False)
        if connected and status != HostStatus.OFFLINE:
            return None
        return time.monotonic() if since is None else since

    @staticmethod
    def _close(row: ProbeRequest, status: ProbeStatus, error: str) -> None:
        ProbeRequest.objects.filter(pk=row.pk, status__in=[ProbeStatus.PENDING, ProbeStatus.SENT]).update(
            status=status, error=error, finished_at=timezone.now()
        )
