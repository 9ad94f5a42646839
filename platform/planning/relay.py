"""The ASGI side of real-engine probes: hand pending `probe` frames to the host's agent connection
and store the `probe_result` answers (see planning/engine_probe.py for the whole round trip).

`relay_probes(host_id, send)` runs for the life of a registered agent connection (started by
agents.consumers.AgentConsumer). One poller per event loop serves all of them: every
``PLANNING_PROBE_POLL_S`` seconds (default 0.5) it claims the pending ProbeRequest rows of every
host connected to this process in one database call (a conditional UPDATE per row, so with several
ASGI processes exactly one sends each) and sends each frame through its host's connection. One
poll per process, not one per connection: N connected agents cost one query per interval.
`store_probe_result` records an answer.

A probe cancelled after it was sent (its job was cancelled, or no longer runs), or given up by its
worker (no answer in time, or its agent stayed away: failed with no result), may still be replayed
by the agent: the poller then sends its frame again with `cancel` set, once (marked by
``result = {"stop_sent": true}`` on the row), so that the agent stops loading the engine for an
answer nobody waits for. A probe the agent answered has a result, and is not stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone
from jobs.models import JobStatus

from core.loops import PerLoop
from gpu_agent.protocol import ProbeReport
from planning.models import ProbeRequest, ProbeStatus

log = logging.getLogger(__name__)

# The longest a replay runs on the agent: the `profile` job's probe_timeout_s is at most this.
MAX_PROBE_TIMEOUT_S = 3600.0


def claim_pending(host_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """Mark the hosts' pending probes sent and return their frames by host, oldest first, after
    the `cancel` frames of probes sent but cancelled since (see the module docstring).

    A probe whose job no longer runs (its worker died, or it was cancelled, while the agent was
    away) is cancelled instead: nobody waits for its answer, and replaying it would load the engine
    for nothing.
    """
    frames: dict[int, list[dict[str, Any]]] = {}
    hosts = list(host_ids)
    orphaned = ProbeRequest.objects.filter(
        host_id__in=hosts, status__in=[ProbeStatus.PENDING, ProbeStatus.SENT], job__isnull=False
    ).exclude(job__status=JobStatus.RUNNING)
    orphaned.update(status=ProbeStatus.CANCELLED, error="its job no longer runs", finished_at=timezone.now())
    stoppable = ProbeRequest.objects.filter(
        host_id__in=hosts,
        status__in=[ProbeStatus.CANCELLED, ProbeStatus.FAILED],
        sent_at__isnull=False,
        result__isnull=True,
        # No replay outlives its timeout (at most MAX_PROBE_TIMEOUT_S): older rows need no stop.
        finished_at__gte=timezone.now() - timedelta(seconds=MAX_PROBE_TIMEOUT_S),
    )
    for pk, host_id, frame in stoppable.order_by("pk").values_list("pk", "host_id", "frame"):
        marked = ProbeRequest.objects.filter(pk=pk, result__isnull=True).update(result={"stop_sent": True})
        if marked:
            frames.setdefault(host_id, []).append({**frame, "cancel": True})
    pending = ProbeRequest.objects.filter(host_id__in=hosts, status=ProbeStatus.PENDING)
    for pk, host_id, frame in pending.order_by("pk").values_list("pk", "host_id", "frame"):
        claimed = ProbeRequest.objects.filter(pk=pk, status=ProbeStatus.PENDING).update(
            status=ProbeStatus.SENT, sent_at=timezone.now()
        )
        if claimed:
            frames.setdefault(host_id, []).append(frame)
    return frames


def store_probe_result(host_id: int, frame: ProbeReport) -> bool:
    """Record the agent's answer; False if no open probe of this host has that id."""
    return bool(
        ProbeRequest.objects.filter(
            probe_id=frame.probe_id, host_id=host_id, status__in=[ProbeStatus.PENDING, ProbeStatus.SENT]
        ).update(
            status=ProbeStatus.DONE if frame.ok else ProbeStatus.FAILED,
            result=frame.to_dict(),
            error=frame.error or "",
            finished_at=timezone.now(),
        )
    )


Send = Callable[[dict[str, Any]], Awaitable[None]]


class _Relay:
    """This event loop's connected hosts (host id -> the `send` of its newest connection) and
    the one task that polls for all of them while any is connected."""

    def __init__(self) -> None:
        self.sends: dict[int, list[Send]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, host_id: int, send: Send) -> None:
        self.sends.setdefault(host_id, []).append(send)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.poll(), name="probe-relay")

    def remove(self, host_id: int, send: Send) -> None:
        sends = self.sends.get(host_id, [])
        if send in sends:
            sends.remove(send)
        if not sends:
            self.sends.pop(host_id, None)
        if not self.sends and self.task is not None:
            self.task.cancel()  # nobody left to poll for (a claim under way is for departed hosts)
            self.task = None

    async def poll(self) -> None:
        claim = database_sync_to_async(claim_pending)
        while self.sends:
            try:
                for host_id, frames in (await claim(sorted(self.sends))).items():
                    await self.deliver(host_id, frames)
            except Exception:
                log.exception("Claiming probes for the connected agents failed")
            await asyncio.sleep(float(getattr(settings, "PLANNING_PROBE_POLL_S", 0.5)))

    async def deliver(self, host_id: int, frames: list[dict[str, Any]]) -> None:
        sends = self.sends.get(host_id)
        if not sends:  # the connection closed while we claimed: the worker's wait times out
            log.warning("The agent of host %s left before %d probe(s) could be sent", host_id, len(frames))
            return
        try:
            for frame in frames:
                await sends[-1](frame)
        except Exception:
            log.exception("Relaying probes to the agent of host %s failed", host_id)


_relays: PerLoop[_Relay] = PerLoop(_Relay)


async def relay_probes(host_id: int, send: Send) -> None:
    """Forever: send the host's pending probe frames through `send` (cancelled on disconnect)."""
    relay = _relays.get()
    relay.add(host_id, send)
    try:
        await asyncio.get_running_loop().create_future()  # never done: runs until the connection cancels it
    finally:
        relay.remove(host_id, send)
