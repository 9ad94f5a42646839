"""The ASGI side of real-engine probes: hand pending `probe` frames to the host's agent connection
and store the `probe_result` answers (see planning/engine_probe.py for the whole round trip).

`relay_probes(host_id, send)` runs for the life of a registered agent connection (started by
agents.consumers.AgentConsumer): every ``PLANNING_PROBE_POLL_S`` seconds (default 0.5) it claims
the host's pending ProbeRequest rows (a conditional UPDATE, so with several ASGI processes exactly
one sends each) and sends their frames. `store_probe_result` records an answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from gpu_agent.protocol import ProbeReport
from planning.models import ProbeRequest, ProbeStatus

log = logging.getLogger(__name__)


def claim_pending(host_id: int) -> list[dict[str, Any]]:
    """Mark the host's pending probes sent and return their frames, oldest first."""
    frames: list[dict[str, Any]] = []
    for row in ProbeRequest.objects.filter(host_id=host_id, status=ProbeStatus.PENDING).order_by("pk"):
        claimed = ProbeRequest.objects.filter(pk=row.pk, status=ProbeStatus.PENDING).update(
            status=ProbeStatus.SENT, sent_at=timezone.now()
        )
        if claimed:
            frames.append(row.frame)
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


async def relay_probes(host_id: int, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Forever: send the host's pending probe frames through `send` (cancelled on disconnect)."""
    interval = float(getattr(settings, "PLANNING_PROBE_POLL_S", 0.5))
    claim = database_sync_to_async(claim_pending)
    while True:
        try:
            for frame in await claim(host_id):
                await send(frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Relaying probes to the agent of host %s failed", host_id)
        await asyncio.sleep(interval)
