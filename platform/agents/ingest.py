"""Storing `telemetry` frames: rows built per frame, written in group commits.

``rows_for(linked, frame)`` turns a frame into plain row tuples (no database access);
``write_rows(batches)`` inserts any number of frames' rows with one ``executemany`` per table in
one transaction. The consumer hands its batches to the process's ``TelemetryWriter``, which writes
whatever accumulated while the previous write ran: one commit per write instead of one per frame,
and no Django model instances on the hot path (see benchmarks/telemetry_ingest.py for the rates).
A frame is stored within one write's time of its arrival; if the ASGI process dies, frames not yet
written are lost, like frames in flight. Rows of a device or deployment deleted while their frame
waited (the foreign keys refuse them) are dropped and the write is tried again without them: the
rest of the frame is stored. When a group commit fails otherwise (a frame the database refuses),
its frames are written again one transaction each, so that a bad frame loses only itself and not
the telemetry of every other host in the group.

Timestamps are the agent's (a frame buffered while the link was down keeps the time it was
sampled), clamped to the server's clock so that a fast agent clock cannot put samples in the
future, where retention would never reach them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from channels.db import database_sync_to_async
from deployments.models import Deployment
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone
from inventory.models import Device

from agents.models import AgentLink, DeviceSample, EngineSample
from agents.services import LinkedHost, wire_pk
from core.loops import PerLoop
from gpu_agent.protocol import Telemetry

log = logging.getLogger(__name__)

# AgentLink.last_telemetry_at is a hint for operators: refresh it at most this often (seconds).
LINK_TOUCH_EVERY_S = 5.0
# A writer holding this many unwritten rows makes submitters wait (back-pressure to the sockets).
MAX_PENDING_ROWS = 20_000
# The writing thread keeps writing newly queued frames for at most this long per hop (seconds).
WRITE_STRETCH_S = 0.2

DEVICE_COLUMNS = [
    "device_id",
    "ts",
    "memory_used_bytes",
    "memory_free_bytes",
    "utilization_pct",
    "temperature_c",
    "power_w",
    "aqua_role",
    "lent_bytes",
    "borrowed_bytes",
    "paired_with",
]
ENGINE_COLUMNS = [
    "deployment_id",
    "ts",
    "state",
    "ttft_count",
    "ttft_p50",
    "ttft_p99",
    "itl_count",
    "itl_p50",
    "itl_p99",
    "kv_cache_usage",
    "running",
    "waiting",
    "preemptions_total",
    "bytes_offloaded",
]


@dataclass
class Batch:
    """One frame's rows, and what it named that this host does not have."""

    host_id: int
    devices: list[tuple[Any, ...]]  # in DEVICE_COLUMNS order, ts as a datetime
    engines: list[tuple[Any, ...]]  # in ENGINE_COLUMNS order
    link_update: tuple[datetime, int] | None = None  # (last_telemetry_at, dropped) to store
    unknown_devices: list[int] = field(default_factory=list)
    unknown_deployments: list[str] = field(default_factory=list)
    host_name: str = ""  # for logs


def rows_for(linked: LinkedHost, frame: Telemetry, now: datetime | None = None) -> Batch:
    """The rows of one frame. Samples naming a device index the host did not register, or a
    deployment that is not on the host, are left out and listed in the batch."""
    now = now or timezone.now()
    ts = min(datetime.fromtimestamp(frame.ts, UTC), now)
    batch = Batch(linked.host_id, [], [], host_name=linked.name)
    for d in frame.devices:
        device_id = linked.device_ids.get(d.index)
        if device_id is None:
            batch.unknown_devices.append(d.index)
            continue
        batch.devices.append(
            (device_id, ts, d.memory_used_bytes, d.memory_free_bytes, d.utilization_pct, d.temperature_c,
             d.power_w, d.aqua_role, d.lent_bytes, d.borrowed_bytes, d.paired_with)
        )  # fmt: skip
    for e in frame.engines:
        # linked.deployment_ids is refreshed whenever the desired list is (re)computed, which
        # happens before an agent can learn of a new deployment.
        pk = wire_pk(e.deployment_id)
        if pk is None or pk not in linked.deployment_ids:
            batch.unknown_deployments.append(e.deployment_id)
            continue
        ttft, itl = e.ttft, e.itl
        batch.engines.append(
            (pk, ts, e.state,
             ttft.count if ttft else 0, ttft.p50 if ttft else None, ttft.p99 if ttft else None,
             itl.count if itl else 0, itl.p50 if itl else None, itl.p99 if itl else None,
             e.kv_cache_usage, e.running, e.waiting, e.preemptions_total, e.bytes_offloaded)
        )  # fmt: skip
    if frame.dropped != linked.dropped or time.monotonic() - linked.link_touched_at >= LINK_TOUCH_EVERY_S:
        batch.link_update = (now, frame.dropped)
        if frame.dropped > linked.dropped:
            log.warning(
                "Agent of %s dropped %d telemetry frame(s) while disconnected (%d in all).",
                linked.name,
                frame.dropped - linked.dropped,
                frame.dropped,
            )
        linked.dropped = frame.dropped
        linked.link_touched_at = time.monotonic()
    return batch


@functools.cache
def _insert_sql_for(vendor: str, table: str, columns: tuple[str, ...]) -> str:
    quote = connection.ops.quote_name
    names = ", ".join(quote(c) for c in columns)
    return f"INSERT INTO {quote(table)} ({names}) VALUES ({', '.join(['%s'] * len(columns))})"


def _insert_sql(model: Any, columns: list[str]) -> str:
    return _insert_sql_for(connection.vendor, model._meta.db_table, tuple(columns))


def write_rows(batches: Sequence[Batch]) -> int:
    """Insert the batches' rows in one transaction; returns the device samples written."""
    adapt = connection.ops.adapt_datetimefield_value
    adapted: dict[datetime, Any] = {}  # a frame's rows share one timestamp: adapt it once

    def db_ts(value: datetime) -> Any:
        out = adapted.get(value)
        if out is None:
            out = adapted[value] = adapt(value)
        return out

    devices = [(r[0], db_ts(r[1]), *r[2:]) for b in batches for r in b.devices]
    engines = [(r[0], db_ts(r[1]), *r[2:]) for b in batches for r in b.engines]
    links = {b.host_id: b.link_update for b in batches if b.link_update is not None}  # the latest wins
    with transaction.atomic(), connection.cursor() as cursor:
        if devices:
            cursor.executemany(_insert_sql(DeviceSample, DEVICE_COLUMNS), devices)
        if engines:
            cursor.executemany(_insert_sql(EngineSample, ENGINE_COLUMNS), engines)
        for host_id, (seen, dropped) in sorted(links.items()):
            AgentLink.objects.filter(host_id=host_id).update(
                last_telemetry_at=seen, telemetry_dropped=dropped
            )
    return len(devices)


def write_dropping_deleted(batches: Sequence[Batch]) -> int:
    """`write_rows`; when a foreign key refuses the rows, again without those of devices and
    deployments deleted since their frames were built. The normal path costs no query more."""
    try:
        return write_rows(batches)
    except IntegrityError:
        if not drop_deleted(batches):
            raise  # something else the database refuses
        return write_rows(batches)


def drop_deleted(batches: Sequence[Batch]) -> int:
    """Drop from the batches (in place) the rows of devices and deployments that no longer exist;
    returns how many rows were dropped."""
    device_ids = {r[0] for b in batches for r in b.devices}
    deployment_ids = {r[0] for b in batches for r in b.engines}
    devices = set(Device.objects.filter(pk__in=device_ids).values_list("pk", flat=True))
    deployments = set(Deployment.objects.filter(pk__in=deployment_ids).values_list("pk", flat=True))
    if devices == device_ids and deployments == deployment_ids:
        return 0
    dropped = 0
    for b in batches:
        before = len(b.devices) + len(b.engines)
        b.devices = [r for r in b.devices if r[0] in devices]
        b.engines = [r for r in b.engines if r[0] in deployments]
        dropped += before - len(b.devices) - len(b.engines)
    log.info(
        "Dropped %d telemetry row(s) of deleted devices %s and deployments %s",
        dropped,
        sorted(device_ids - devices),
        sorted(deployment_ids - deployments),
    )
    return dropped


def write_each(batches: Sequence[Batch]) -> list[Batch]:
    """Write the batches one transaction each (after their group commit failed); returns those
    that failed, each logged with its host. Stops at an error of the connection itself: the
    remaining batches would fail the same way."""
    failed: list[Batch] = []
    for i, batch in enumerate(batches):
        try:
            write_dropping_deleted([batch])
        except (OperationalError, InterfaceError):
            log.exception("Telemetry writes failed: the database is unavailable")
            return failed + list(batches[i:])
        except Exception:
            log.exception(
                "A telemetry frame of host %s (id %s) could not be stored; it is lost",
                batch.host_name or "?",
                batch.host_id,
            )
            failed.append(batch)
    return failed


def store_telemetry(linked: LinkedHost, frame: Telemetry, now: datetime | None = None) -> Batch:
    """Build and write one frame's rows at once (no batching); returns the batch."""
    batch = rows_for(linked, frame, now)
    write_rows([batch])
    return batch


class TelemetryWriter:
    """Group commit for one event loop: `submit()` queues a batch; one task writes everything
    queued so far, then everything queued meanwhile, until nothing is left (then it ends).

    While frames keep arriving the writing thread keeps taking them itself for up to
    ``WRITE_STRETCH_S``, so a busy stretch is one `database_sync_to_async` call: one thread hop
    and one database connection for many transactions (with SQLite, where Django closes the
    connection after every such call, a hop per write opened a connection per write). Then it
    returns, so that other database calls queued for the same thread (heartbeats, registrations)
    get their turn, and Django's connection clean-up runs as after any other call."""

    def __init__(self, max_pending_rows: int = MAX_PENDING_ROWS) -> None:
        self._lock = threading.Lock()  # guards _pending and _pending_rows (loop and writing thread)
        self._pending: list[Batch] = []
        self._pending_rows = 0
        self._max_pending_rows = max_pending_rows
        self._task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()  # set: room for more (touched on the event loop only)
        self._drained.set()

    async def submit(self, batch: Batch) -> None:
        """Queue ``batch``; waits first while the writer is too far behind."""
        while self._pending_rows >= self._max_pending_rows:
            self._drained.clear()
            await self._drained.wait()
        with self._lock:
            self._pending.append(batch)
            self._pending_rows += len(batch.devices) + len(batch.engines)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="telemetry-writer")

    async def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:  # re-checked on the loop: a batch queued as the thread finished
            try:
                await database_sync_to_async(self._write_pending)(loop)
            except Exception:  # e.g. Django's connection clean-up around the call failed
                lost = self._take()
                self._drained.set()
                log.exception("The telemetry writer failed; %d frame(s) are lost", len(lost))

    def _take(self) -> list[Batch]:
        with self._lock:
            batches, self._pending, self._pending_rows = self._pending, [], 0
        return batches

    def _write_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        """In the database thread: write what is queued, again and again, until nothing is or
        ``WRITE_STRETCH_S`` has passed."""
        deadline = time.monotonic() + WRITE_STRETCH_S
        while time.monotonic() < deadline and (batches := self._take()):
            loop.call_soon_threadsafe(self._drained.set)  # room again for submitters
            try:
                write_dropping_deleted(batches)
            except Exception:
                if len(batches) == 1:
                    only = batches[0]
                    log.exception(
                        "A telemetry frame of host %s (id %s) could not be stored; it is lost",
                        only.host_name or "?",
                        only.host_id,
                    )
                else:  # find the bad frame(s): the others are stored
                    log.warning("Writing %d telemetry frame(s) failed; writing them one by one", len(batches))
                    lost = write_each(batches)
                    if lost:
                        log.warning("%d of %d telemetry frame(s) are lost", len(lost), len(batches))
                return  # back to the loop: Django's clean-up drops a broken connection first


_writers: PerLoop[TelemetryWriter] = PerLoop(TelemetryWriter)


def writer() -> TelemetryWriter:
    """This event loop's writer (one per ASGI process in production)."""
    return _writers.get()
