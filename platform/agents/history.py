"""Reading telemetry for charts: raw samples, or per-minute series (stored + not yet folded).

``resolution`` is "raw" (per-second samples, only as far back as the raw window), "minute" (stored
minute rows merged with minutes computed on the fly from raw samples not folded yet), or "auto":
raw when ``since`` lies inside the raw window, else minute. Series are ordered by time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.db.models import Model

from agents.ingest import DEVICE_COLUMNS, ENGINE_COLUMNS
from agents.models import DeviceMinute, DeviceSample, EngineMinute, EngineSample
from agents.retention import DEVICE_SPEC, ENGINE_SPEC, INTEGER_FIELDS, Spec, fold, merge, raw_cutoff

Resolution = Literal["raw", "minute"]
RESOLUTIONS = ("auto", "raw", "minute")

# The stored columns of a sample, less the device / deployment it belongs to.
DEVICE_RAW_FIELDS = DEVICE_COLUMNS[1:]
ENGINE_RAW_FIELDS = ENGINE_COLUMNS[1:]


def choose_resolution(requested: str, since: datetime, now: datetime) -> Resolution:
    if requested == "raw" or (requested == "auto" and since >= raw_cutoff(now)):
        return "raw"
    return "minute"


def device_series(
    device_ids: list[int], since: datetime, resolution: Resolution
) -> dict[int, list[dict[str, Any]]]:
    """device pk -> its samples since ``since``."""
    if resolution == "raw":
        return _raw(DeviceSample, "device_id", device_ids, since, DEVICE_RAW_FIELDS)
    return _minutes(DeviceSample, DeviceMinute, "device_id", device_ids, since, DEVICE_SPEC)


def engine_series(deployment_id: int, since: datetime, resolution: Resolution) -> list[dict[str, Any]]:
    """A deployment's engine samples since ``since``."""
    return engines_series([deployment_id], since, resolution)[deployment_id]


def engines_series(
    deployment_ids: list[int], since: datetime, resolution: Resolution
) -> dict[int, list[dict[str, Any]]]:
    """deployment pk -> its engine samples since ``since`` (the same queries for any number)."""
    if resolution == "raw":
        return _raw(EngineSample, "deployment_id", deployment_ids, since, ENGINE_RAW_FIELDS)
    return _minutes(EngineSample, EngineMinute, "deployment_id", deployment_ids, since, ENGINE_SPEC)


def _raw(
    model: type[Model], key: str, ids: list[int], since: datetime, fields: list[str]
) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {pk: [] for pk in ids}
    rows = model._default_manager.filter(**{f"{key}__in": ids, "ts__gte": since}).order_by(key, "ts", "pk")
    for row in rows.values(key, *fields):
        out[row.pop(key)].append(row)
    return out


def _minutes(
    raw_model: type[Model], minute_model: type[Model], key: str, ids: list[int], since: datetime, spec: Spec
) -> dict[int, list[dict[str, Any]]]:
    start = since.replace(second=0, microsecond=0)
    stored = minute_model._default_manager.filter(**{f"{key}__in": ids, "minute__gte": start})
    merged: dict[tuple[int, datetime], dict[str, Any]] = {
        (row[key], row["minute"]): row for row in stored.values(key, "minute", "samples", *spec)
    }
    raw = raw_model._default_manager.filter(**{f"{key}__in": ids, "ts__gte": start}).order_by(key, "ts", "pk")
    sources = sorted({source for _, source, _ in spec.values()} | {key, "ts"})
    for k, agg in fold(spec, key, raw.values(*sources)).items():
        prev = merged.get(k)
        merged[k] = agg if prev is None else merge(spec, prev, agg)
    out: dict[int, list[dict[str, Any]]] = {pk: [] for pk in ids}
    for (pk, minute), agg in sorted(merged.items()):
        point = {"ts": minute, "samples": agg["samples"]}
        for name in spec:
            value = agg[name]
            point[name] = round(value) if name in INTEGER_FIELDS and value is not None else value
        out[pk].append(point)
    return out
