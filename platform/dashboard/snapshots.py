"""What the dashboard shows, read from the database as plain JSON-ready dicts.

Every live view is a *keyed snapshot*: ``key -> value`` (``"device:12" -> card``), so that a socket
can send only the keys whose values changed since its last push (see dashboard/deltas.py). The
same functions render the first page load, so the page and the socket never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from agents import history
from agents.models import DeviceSample, EngineSample
from deployments.models import Deployment
from django.db.models import OuterRef, Subquery
from django.utils import timezone
from inventory.models import Device, Host
from jobs.models import Job
from registry.models import ServedModel

Snapshot = dict[str, Any]

# How many jobs the jobs page lists (newest first).
JOBS_SHOWN = 50
# Engine samples the model page loads as history.
HISTORY_WINDOW = timedelta(minutes=10)
# Windows the SLO attainment is computed over: the last minute, what the model page's socket holds
# (dashboard.consumers.SUMMARY_WINDOWS one-second windows).
ATTAINMENT_WINDOW = timedelta(seconds=60)


def span_label(span: timedelta) -> str:
    """How a page names the span before now: "last minute", "last 5 minutes", "last 30 s"."""
    seconds = int(span.total_seconds())
    if seconds % 60:
        return f"last {seconds} s"
    return "last minute" if seconds == 60 else f"last {seconds // 60} minutes"


def _latest_samples(device_ids: list[int]) -> dict[int, DeviceSample]:
    """device pk -> its newest sample (one query for the ids, one for the rows)."""
    newest = DeviceSample.objects.filter(device=OuterRef("pk")).order_by("-ts", "-pk").values("pk")[:1]
    ids = (
        Device.objects.filter(pk__in=device_ids)
        .annotate(sample=Subquery(newest))
        .values_list("sample", flat=True)
    )
    return {s.device_id: s for s in DeviceSample.objects.filter(pk__in=[i for i in ids if i is not None])}


def device_card(device: Device, sample: DeviceSample | None) -> dict[str, Any]:
    """One GPU card: role, memory split (used / lent / borrowed / free) and its pairing."""
    card: dict[str, Any] = {
        "host": device.host_id,
        "index": device.index,
        "name": device.name,
        "kind": device.kind,
        "total": device.memory_total_bytes,
        "role": "none",
        "used": 0,
        "lent": 0,
        "borrowed": 0,
        "free": device.memory_total_bytes,
        "paired_with": None,
        "utilization": None,
        "ts": None,
        "deployments": [],  # what the operator placed on it (overview() fills it in)
    }
    if sample is not None:
        card.update(
            role=sample.aqua_role,
            used=sample.memory_used_bytes,
            lent=sample.lent_bytes,
            borrowed=sample.borrowed_bytes,
            free=sample.memory_free_bytes,
            paired_with=sample.paired_with,
            utilization=sample.utilization_pct,
            ts=sample.ts.isoformat(),
        )
    return card


def overview() -> Snapshot:
    """Hosts (``host:<pk>``) and their devices (``device:<pk>``), with each device's latest sample."""
    snap: Snapshot = {}
    hosts = list(Host.objects.order_by("name", "pk"))
    devices = list(Device.objects.filter(host__in=hosts).order_by("host_id", "index"))
    samples = _latest_samples([d.pk for d in devices])
    for host in hosts:
        snap[f"host:{host.pk}"] = {
            "name": host.name,
            "status": host.status,
            "simulated": host.simulated,
            "last_seen": host.last_seen_at.isoformat() if host.last_seen_at else None,
        }
    placed = _placed([d.pk for d in devices])
    for device in devices:
        card = device_card(device, samples.get(device.pk))
        card["deployments"] = placed.get(device.pk, [])
        snap[f"device:{device.pk}"] = card
    return snap


def _placed(device_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """device pk -> the deployments placed on it (by id): model, desired and observed state. One
    query; a stopped deployment keeps its devices, so it is listed (stopped) until deleted."""
    rows = (
        Deployment.devices.through.objects.filter(device_id__in=device_ids)
        .order_by("device_id", "deployment_id")
        .values_list(
            "device_id",
            "deployment_id",
            "deployment__model_id",
            "deployment__model__name",
            "deployment__desired_state",
            "deployment__observed_state",
        )
    )
    placed: dict[int, list[dict[str, Any]]] = {}
    for device_id, pk, model_id, model, desired, observed in rows:
        placed.setdefault(device_id, []).append(
            {"id": pk, "model_id": model_id, "model": model, "desired": desired, "observed": observed}
        )
    return placed


def lends_to(card: dict[str, Any], cards: Mapping[tuple[int, int], dict[str, Any]]) -> int | None:
    """The index of the device ``card``'s device lends to, or None (frontend overview.js: lendsTo).

    A producer lends to its ``paired_with``. A device that both lends and borrows reports itself as
    a consumer (gpu_agent.aqua.device_states) with lent bytes: it lends to ``paired_with`` when
    that is itself (a CPU host whose engine borrows the host memory lent there) or a device that
    borrows and names it back; otherwise ``paired_with`` is its own lender, not a borrower."""
    peer = card["paired_with"]
    if peer is None:
        return None
    if card["role"] == "producer" or (card["lent"] > 0 and peer == card["index"]):
        return int(peer)
    other = cards.get((card["host"], peer))
    if (
        card["lent"] > 0
        and other is not None
        and other["borrowed"] > 0
        and other["paired_with"] == card["index"]
    ):
        return int(peer)
    return None


def pairings(snap: Snapshot) -> list[dict[str, Any]]:
    """Lender -> borrower pairs on each host, from the cards of an overview snapshot (a device that
    lends to its own engine is paired with itself)."""
    cards = {(c["host"], c["index"]): c for c in snap.values() if "index" in c}
    pairs = []
    for card in cards.values():
        borrower = lends_to(card, cards)
        if borrower is not None:
            pairs.append({"host": card["host"], "lender": card["index"], "borrower": borrower})
    return sorted(pairs, key=lambda p: (p["host"], p["lender"]))


def job_row(job: Job) -> dict[str, Any]:
    return {
        "kind": job.kind,
        "status": job.status,
        "progress": round(job.progress, 4),
        "error": job.error[:500],
        "created": job.created_at.isoformat(),
        "finished": job.finished_at.isoformat() if job.finished_at else None,
    }


def jobs(through: int | None = None) -> Snapshot:
    """The newest ``JOBS_SHOWN`` jobs (``job:<pk>``), or with ``through`` the newest up to that
    one (the rows of a page of older jobs): status and progress."""
    listed = Job.objects.order_by("-pk")
    if through is not None:
        listed = listed.filter(pk__lte=through)
    return {f"job:{job.pk}": job_row(job) for job in listed[:JOBS_SHOWN]}


def job(pk: int) -> Snapshot:
    """One job (``job:<pk>``), newest or not; empty if it is gone."""
    return {f"job:{job.pk}": job_row(job) for job in Job.objects.filter(pk=pk)}


def _point(sample: dict[str, Any], previous_ts: datetime | None) -> dict[str, Any]:
    """A chart point from an engine sample; the request rate is first tokens per second of window."""
    ts: datetime = sample["ts"]
    window = (ts - previous_ts).total_seconds() if previous_ts is not None else 0.0
    rate = sample["ttft_count"] / window if window > 0 else None
    return {
        "ts": ts.isoformat(),
        "ttft_p50": sample["ttft_p50"],
        "ttft_p99": sample["ttft_p99"],
        "tbt_p50": sample["itl_p50"],
        "tbt_p99": sample["itl_p99"],
        "rate": rate,
        "running": sample["running"],
        "waiting": sample["waiting"],
        "preemptions": sample["preemptions_total"],
        "offloaded": sample["bytes_offloaded"],
    }


def engine_points(
    after: Mapping[int, datetime], seen: Mapping[int, bool]
) -> dict[int, tuple[list[dict[str, Any]], datetime]]:
    """deployment pk -> (its raw engine samples newer than ``after[pk]`` as chart points, the newest
    sample time seen), in one query for any number of deployments. ``seen[pk]``: ``after[pk]`` is the
    time of a sample already read, the window before the first new one."""
    if not after:
        return {}
    rows = (
        EngineSample.objects.filter(deployment_id__in=list(after), ts__gt=min(after.values()))
        .order_by("deployment_id", "ts", "pk")
        .values("deployment_id", *history.ENGINE_RAW_FIELDS)
    )
    points: dict[int, list[dict[str, Any]]] = {pk: [] for pk in after}
    newest = dict(after)
    previous = {pk: (after[pk] if seen.get(pk) else None) for pk in after}
    for row in rows:
        pk = row.pop("deployment_id")
        if row["ts"] <= after[pk]:
            continue
        points[pk].append(_point(row, previous[pk]))
        previous[pk] = newest[pk] = row["ts"]
    return {pk: (points[pk], newest[pk]) for pk in after}


def deployment_state(observed_state: str, desired_state: str) -> str:
    """A deployment's state as the model page shows it (its template and its socket alike)."""
    return observed_state + (" (stopping or stopped)" if desired_state == "stopped" else "")


def model_history(model: ServedModel) -> dict[int, list[dict[str, Any]]]:
    """deployment pk -> its points over the last ``HISTORY_WINDOW`` (raw, or per-minute further back)."""
    since = timezone.now() - HISTORY_WINDOW
    resolution = history.choose_resolution("auto", since, timezone.now())
    deployments = list(Deployment.objects.filter(model=model).order_by("pk").values_list("pk", flat=True))
    out = {}
    for pk, samples in history.engines_series(deployments, since, resolution).items():
        points, prev = [], None
        for s in samples:
            points.append(_point({**s, "ttft_count": s.get("ttft_count", 0)}, prev))
            prev = s["ts"]
        out[pk] = points
    return out


def attainment(model: ServedModel, points: list[dict[str, Any]], now: datetime | None = None) -> float | None:
    """Share of telemetry windows (percent) of the last ``ATTAINMENT_WINDOW`` that met the model's
    SLOs: p99 TTFT within ``slo_ttft_p99_ms`` if the window had first tokens, p99 TBT within
    ``slo_tbt_p99_ms`` if it had inter-token gaps (a window of decoding only is judged on its TBT, one
    of single-token answers on its TTFT); windows with neither are not judged.

    Only recent windows count, whatever the caller holds: the model page (10 minutes of history)
    and its socket (the last ``SUMMARY_WINDOWS`` points per deployment, kept even for a deployment
    that stopped reporting) then show the same figure, and old windows are forgotten."""
    since = (now or timezone.now()) - ATTAINMENT_WINDOW
    judged = [
        p
        for p in points
        if (p["ttft_p99"] is not None or p["tbt_p99"] is not None) and datetime.fromisoformat(p["ts"]) > since
    ]
    if not judged:
        return None
    ok = sum(
        1
        for p in judged
        if (p["ttft_p99"] is None or p["ttft_p99"] * 1000 <= model.slo_ttft_p99_ms)
        and (p["tbt_p99"] is None or p["tbt_p99"] * 1000 <= model.slo_tbt_p99_ms)
    )
    return round(100.0 * ok / len(judged), 1)
