"""Bounded telemetry retention: raw per-second samples, then per-minute aggregates, then nothing.

``downsample_and_prune(now)`` folds every raw sample older than the raw window (cut at a minute
boundary, so a minute is always folded whole) into ``DeviceMinute`` / ``EngineMinute`` rows,
deletes those raw rows, and deletes minute rows older than the history window. A sample that
arrives late for a minute already folded (an agent flushing its buffer after a reconnect) is
merged into the existing minute row, weighted by sample counts. The same sweep prunes the chat
gateway's per-request latency samples (``gateway.services.prune_request_samples``), the other
table that grows with traffic, and its expired token reservations (those of a web process that died
mid-request, ``gateway.reservations.prune_token_reservations``).

It runs every ``TELEMETRY_DOWNSAMPLE_INTERVAL_S`` in the ASGI process's sweeper (agents/sweeper.py) and
as the Celery task ``agents.downsample_telemetry`` (beat schedule in settings) where beat runs.

Aggregation rules per field (``Rule``): MEAN (of non-null values, weighted by sample counts), MAX,
SUM, LAST (the newest sample's value) and WMEAN (mean weighted by a count field, e.g. a window's
p50 TTFT weighted by its request count). Every aggregate fits its column whatever the samples (the
protocol bounds each sample to its raw column, not their sum): a mean lies between its values (a
mean of two samples of 2**63-1 bytes computed in floats would round to 2**63, past a ``bigint``;
one of two of the largest floats would overflow to infinity, which the history API cannot send as
JSON), and a SUM stops at ``MAX_COUNT`` (the counts are 32-bit columns, and a minute of windows each
counting up to that is more).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from gateway.reservations import prune_token_reservations
from gateway.services import prune_request_samples

from agents.models import DeviceMinute, DeviceSample, EngineMinute, EngineSample
from gpu_agent.protocol import MAX_COUNT

log = logging.getLogger(__name__)


class Rule(Enum):
    MEAN = "mean"
    MAX = "max"
    SUM = "sum"
    LAST = "last"
    WMEAN = "wmean"


# field -> (rule, source field in a raw sample, weight field for WMEAN)
Spec = dict[str, tuple[Rule, str, str | None]]
DEVICE_SPEC: Spec = {
    "memory_used_bytes": (Rule.MEAN, "memory_used_bytes", None),
    "memory_used_max_bytes": (Rule.MAX, "memory_used_bytes", None),
    "memory_free_bytes": (Rule.MEAN, "memory_free_bytes", None),
    "utilization_pct": (Rule.MEAN, "utilization_pct", None),
    "temperature_c": (Rule.MEAN, "temperature_c", None),
    "power_w": (Rule.MEAN, "power_w", None),
    "aqua_role": (Rule.LAST, "aqua_role", None),
    "lent_bytes": (Rule.MAX, "lent_bytes", None),
    "borrowed_bytes": (Rule.MAX, "borrowed_bytes", None),
}
ENGINE_SPEC: Spec = {
    "state": (Rule.LAST, "state", None),
    "ttft_p50": (Rule.WMEAN, "ttft_p50", "ttft_count"),
    "ttft_p99": (Rule.MAX, "ttft_p99", None),
    "ttft_count": (Rule.SUM, "ttft_count", None),
    "itl_p50": (Rule.WMEAN, "itl_p50", "itl_count"),
    "itl_p99": (Rule.MAX, "itl_p99", None),
    "itl_count": (Rule.SUM, "itl_count", None),
    "kv_cache_usage": (Rule.MEAN, "kv_cache_usage", None),
    "running": (Rule.MEAN, "running", None),
    "waiting": (Rule.MEAN, "waiting", None),
    "preemptions_total": (Rule.MAX, "preemptions_total", None),
    "bytes_offloaded": (Rule.MAX, "bytes_offloaded", None),
}
# Stored as integers in the minute tables (means are rounded).
INTEGER_FIELDS = {"memory_used_bytes", "memory_free_bytes"}

Key = tuple[int, datetime]  # (device or deployment pk, minute start)


def minute_of(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def _mean(a: Any, wa: float, b: Any, wb: float) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    # Weights first: ``a * wa + b * wb`` may overflow (to infinity, or past 2**63 once rounded)
    # where each value fits. The clamp keeps float rounding inside the values' range.
    total = wa + wb
    mean = a * (wa / total) + b * (wb / total)
    return min(max(mean, min(a, b)), max(a, b))


def _count(agg: dict[str, Any], name: str) -> int:
    """How many samples a MEAN field's value stands for: those that reported it. Aggregates read
    back from a minute row lack the count; all their samples are assumed to have reported it."""
    return agg.get(name + "#n", agg["samples"] if agg[name] is not None else 0)


def merge(spec: Spec, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine two aggregates of the same key; ``b`` is the newer. Each has "samples"."""
    na, nb = a["samples"], b["samples"]
    out: dict[str, Any] = {"samples": na + nb}
    for name, (rule, _, weight) in spec.items():
        x, y = a[name], b[name]
        if rule is Rule.MEAN:
            ca, cb = _count(a, name), _count(b, name)
            out[name] = _mean(x, ca, y, cb)
            out[name + "#n"] = ca + cb
        elif rule is Rule.MAX:
            out[name] = y if x is None else x if y is None else max(x, y)
        elif rule is Rule.SUM:  # per-window counts, into 32-bit columns: saturated
            out[name] = min(x + y, MAX_COUNT)
        elif rule is Rule.LAST:
            out[name] = y
        else:
            assert weight is not None
            wa, wb = a[weight], b[weight]
            out[name] = _mean(x if wa else None, wa, y if wb else None, wb)
    return out


def fold(spec: Spec, key_field: str, rows: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Aggregate raw sample rows (dicts with ``key_field``, "ts" and the spec's sources) per minute.

    Rows must come in ``ts`` order per key so that LAST picks the newest value.
    """
    out: dict[Key, dict[str, Any]] = {}
    for row in rows:
        one = {name: row[source] for name, (_, source, _) in spec.items()}
        one["samples"] = 1
        for name, (rule, _, _) in spec.items():
            if rule is Rule.MEAN:
                one[name + "#n"] = int(one[name] is not None)
        key = (row[key_field], minute_of(row["ts"]))
        prev = out.get(key)
        out[key] = one if prev is None else merge(spec, prev, one)
    return out


@dataclass(frozen=True)
class RetentionReport:
    device_minutes: int  # minute rows written (created or merged)
    engine_minutes: int
    raw_deleted: int
    minutes_deleted: int
    request_samples_deleted: int = 0  # the gateway's, past their retention
    reservations_deleted: int = 0  # the gateway's token reservations, expired


def raw_cutoff(now: datetime) -> datetime:
    """Raw samples before this instant are folded into minutes (a minute boundary)."""
    return minute_of(now - timedelta(seconds=settings.TELEMETRY_RAW_RETENTION_S))


def downsample_and_prune(now: datetime | None = None) -> RetentionReport:
    """Fold raw samples past the raw window into minutes; drop minutes past the history window and
    the gateway's request samples past theirs and its expired token reservations."""
    now = now or timezone.now()
    cutoff = raw_cutoff(now)
    with transaction.atomic():
        dev_n, dev_del = _downsample(DeviceSample, DeviceMinute, "device_id", DEVICE_SPEC, cutoff)
        eng_n, eng_del = _downsample(EngineSample, EngineMinute, "deployment_id", ENGINE_SPEC, cutoff)
        history_start = now - timedelta(seconds=settings.TELEMETRY_HISTORY_RETENTION_S)
        old_dev, _ = DeviceMinute.objects.filter(minute__lt=history_start).delete()
        old_eng, _ = EngineMinute.objects.filter(minute__lt=history_start).delete()
    requests = prune_request_samples(now)  # unrelated rows: not inside the telemetry transaction
    # Expired by the database clock, the one reservations are made and counted by (not ``now``).
    reservations = prune_token_reservations()
    report = RetentionReport(dev_n, eng_n, dev_del + eng_del, old_dev + old_eng, requests, reservations)
    if report.raw_deleted or report.minutes_deleted or report.request_samples_deleted or reservations:
        log.info("Telemetry retention: %s", report)
    return report


def _downsample(
    raw_model: Any, minute_model: Any, key_field: str, spec: Spec, cutoff: datetime
) -> tuple[int, int]:
    old = raw_model.objects.filter(ts__lt=cutoff)
    sources = sorted({source for _, source, _ in spec.values()} | {key_field, "ts", "pk"})
    max_pk = 0

    def rows() -> Iterable[dict[str, Any]]:
        nonlocal max_pk
        # In time order (fold's LAST needs it per key): read along the ts index, no sort.
        for row in old.order_by("ts", "pk").values(*sources).iterator(2000):
            max_pk = max(max_pk, row["pk"])
            yield row

    folded = fold(spec, key_field, rows())
    fk = key_field.removesuffix("_id")
    live = _lock_keys(raw_model._meta.get_field(fk).related_model, {k for k, _ in folded})
    folded = {key: agg for key, agg in folded.items() if key[0] in live}  # the rest cascade away
    if not folded:
        return 0, 0
    existing = {
        (getattr(m, key_field), m.minute): m
        for m in minute_model.objects.select_for_update().filter(
            **{f"{key_field}__in": {k for k, _ in folded}, "minute__in": {m for _, m in folded}}
        )
    }
    create, update = [], []
    for key in sorted(folded):
        agg = folded[key]
        row = existing.get(key)
        if row is not None:
            agg = merge(spec, {"samples": row.samples, **{f: getattr(row, f) for f in spec}}, agg)
        values = {
            f: (round(v) if f in INTEGER_FIELDS and v is not None else v)
            for f, v in agg.items()
            if "#" not in f
        }
        if row is None:
            create.append(minute_model(**{key_field: key[0], "minute": key[1]}, **values))
        else:
            for name, value in values.items():
                setattr(row, name, value)
            update.append(row)
    minute_model.objects.bulk_create(create, batch_size=1000)
    if update:
        minute_model.objects.bulk_update(update, ["samples", *spec], batch_size=1000)
    # Only the rows folded above: a late row another process inserted meanwhile waits for next time.
    deleted, _ = old.filter(pk__lte=max_pk).delete()
    log.debug("Folded %d raw %s rows into %d minute rows.", deleted, fk, len(folded))
    return len(folded), deleted


def _lock_keys(model: Any, pks: set[int]) -> set[int]:
    """Which of these devices or deployments still exist, locked FOR KEY SHARE until the pass
    commits: the lock its new minute rows' foreign-key checks take at commit, taken before the
    pass locks or deletes rows of theirs. A delete (which locks its row first, then deletes the
    rows referring to it) then either waits for the pass or is done before it, instead of the two
    waiting for each other. SQLite has one writer at a time: nothing to lock."""
    if not pks:
        return set()
    if connection.vendor != "postgresql":
        return set(model.objects.filter(pk__in=pks).values_list("pk", flat=True))
    table, pk = (connection.ops.quote_name(n) for n in (model._meta.db_table, model._meta.pk.column))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {pk} FROM {table} WHERE {pk} = ANY(%s) ORDER BY {pk} FOR KEY SHARE", [sorted(pks)]
        )
        return {row[0] for row in cursor.fetchall()}
