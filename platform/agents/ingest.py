"""Storing `telemetry` frames: one transaction and one bulk insert per table per frame.

Timestamps are the agent's (a frame buffered while the link was down keeps the time it was
sampled), clamped to the server's clock so a fast agent clock cannot put samples in the future,
where retention would never reach them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from agents.models import AgentLink, DeviceSample, EngineSample
from agents.services import LinkedHost
from gpu_agent.protocol import Telemetry

log = logging.getLogger(__name__)

# AgentLink.last_telemetry_at is a hint for operators: refresh it at most this often (seconds),
# so that a frame costs inserts only, not an extra UPDATE.
LINK_TOUCH_EVERY_S = 5.0


@dataclass(frozen=True)
class Stored:
    """How many rows one frame produced, and what it named that this host does not have."""

    devices: int
    engines: int
    unknown_devices: tuple[int, ...] = ()
    unknown_deployments: tuple[str, ...] = ()


def store_telemetry(linked: LinkedHost, frame: Telemetry, now: datetime | None = None) -> Stored:
    """Store one frame's device and engine samples.

    Samples naming a device index the host did not register, or a deployment that is not on the
    host, are skipped and reported in the result (the consumer answers them with an error frame).
    """
    now = now or timezone.now()
    ts = min(datetime.fromtimestamp(frame.ts, UTC), now)
    device_rows: list[DeviceSample] = []
    unknown_devices: list[int] = []
    for d in frame.devices:
        device_id = linked.device_ids.get(d.index)
        if device_id is None:
            unknown_devices.append(d.index)
            continue
        device_rows.append(
            DeviceSample(
                device_id=device_id,
                ts=ts,
                memory_used_bytes=d.memory_used_bytes,
                memory_free_bytes=d.memory_free_bytes,
                utilization_pct=d.utilization_pct,
                temperature_c=d.temperature_c,
                power_w=d.power_w,
                aqua_role=d.aqua_role,
                lent_bytes=d.lent_bytes,
                borrowed_bytes=d.borrowed_bytes,
                paired_with=d.paired_with,
            )
        )
    engine_rows, unknown_deployments = _engine_rows(linked, frame, ts)
    touch = frame.dropped != linked.dropped or time.monotonic() - linked.link_touched_at >= LINK_TOUCH_EVERY_S
    with transaction.atomic():
        DeviceSample.objects.bulk_create(device_rows)
        if engine_rows:
            EngineSample.objects.bulk_create(engine_rows)
        if touch:
            AgentLink.objects.filter(host_id=linked.host_id).update(
                last_telemetry_at=now, telemetry_dropped=frame.dropped
            )
    if touch:
        if frame.dropped > linked.dropped:
            log.warning(
                "Agent of %s dropped %d telemetry frame(s) while disconnected (%d in all).",
                linked.name,
                frame.dropped - linked.dropped,
                frame.dropped,
            )
        linked.dropped = frame.dropped
        linked.link_touched_at = time.monotonic()
    return Stored(len(device_rows), len(engine_rows), tuple(unknown_devices), tuple(unknown_deployments))


def _engine_rows(linked: LinkedHost, frame: Telemetry, ts: datetime) -> tuple[list[EngineSample], list[str]]:
    rows: list[EngineSample] = []
    unknown: list[str] = []
    for e in frame.engines:
        # linked.deployment_ids is refreshed whenever the desired list is (re)computed, which
        # happens before an agent can learn of a new deployment.
        pk = int(e.deployment_id) if e.deployment_id.isdigit() else None
        if pk is None or pk not in linked.deployment_ids:
            unknown.append(e.deployment_id)
            continue
        ttft, itl = e.ttft, e.itl
        rows.append(
            EngineSample(
                deployment_id=pk,
                ts=ts,
                state=e.state,
                ttft_count=ttft.count if ttft else 0,
                ttft_p50=ttft.p50 if ttft else None,
                ttft_p99=ttft.p99 if ttft else None,
                itl_count=itl.count if itl else 0,
                itl_p50=itl.p50 if itl else None,
                itl_p99=itl.p99 if itl else None,
                kv_cache_usage=e.kv_cache_usage,
                running=e.running,
                waiting=e.waiting,
                preemptions_total=e.preemptions_total,
                bytes_offloaded=e.bytes_offloaded,
            )
        )
    return rows, unknown
