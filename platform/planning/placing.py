"""The `place` job: Aqua placement of every registered model over every host, as a diff.

Servers are the hosts with GPU devices (simulated hosts count): one `ServerSpec` per host, with its
GPU count, the smallest GPU's memory, and NVLink when every GPU is a peer of every other. Models are
all registered models (or the job's `models`), each with its current `ModelProfile`; tensor
parallelism is the model's ``tensor_parallel_size``. Anything wrong (a model without a profile, a
profile measured against another SLO than the model's current one, an infeasible instance) fails
the job with a message naming it, and nothing is stored or applied.

The plan is relabelled for the fewest moves against the deployments meant to run now
(`serving.placement.fewest_moves`) and stored as a `PlacementPlan` with a fingerprint of those
deployments, so that applying it later can tell whether they changed (planning/applying.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from deployments.models import Deployment, DesiredState
from django.db import transaction
from inventory.models import DeviceKind, Host
from jobs.models import Job, JobStatus
from jobs.registry import JobCancelled, JobContext
from registry.models import ServedModel

from planning.jobctx import cancel_fn, job_id_of, progress_fn
from planning.models import ModelProfile, PlacementPlan
from serving.placement import ModelProfile as PlacerProfile
from serving.placement import (
    PlacementCancelled,
    PlacementError,
    PlacerConfig,
    ServerSpec,
    fewest_moves,
    get_placer,
    require_profiles,
)
from serving.profiler import ProfilingError, model_profile_from_dict


def servers() -> list[ServerSpec]:
    """One ServerSpec per host with GPU devices, ordered by host name."""
    out: list[ServerSpec] = []
    for host in Host.objects.prefetch_related("devices").order_by("name"):
        gpus = sorted((d for d in host.devices.all() if d.kind == DeviceKind.GPU), key=lambda d: d.index)
        if not gpus:
            continue
        indices = {d.index for d in gpus}
        nvlink = all(indices - {d.index} <= set(d.nvlink_peers or []) for d in gpus)
        out.append(ServerSpec(host.name, len(gpus), min(d.memory_total_bytes for d in gpus), nvlink))
    return out


def running_deployments() -> list[Deployment]:
    """Deployments meant to run, by id (the placement the plan is diffed against)."""
    return list(
        Deployment.objects.filter(desired_state=DesiredState.RUNNING)
        .select_related("model", "host")
        .prefetch_related("devices")
        .order_by("pk")
    )


def current_placement(models: set[str]) -> dict[str, tuple[str, list[int]]]:
    """model name -> (host name, device indices) of its first running deployment, for `models`
    (models outside a plan are left alone by it)."""
    current: dict[str, tuple[str, list[int]]] = {}
    for d in running_deployments():
        if d.model.name in models:
            current.setdefault(d.model.name, (d.host.name, sorted(dev.index for dev in d.devices.all())))
    return current


def fingerprint() -> str:
    """Digest of every running deployment's (id, model, host, devices): changes when any does."""
    rows = [
        [d.pk, d.model.name, d.host.name, sorted(dev.index for dev in d.devices.all())]
        for d in running_deployments()
    ]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def profiles_for(models: list[ServedModel], burst_level: float) -> list[PlacerProfile]:
    """The placer's view of each model; PlacementError naming every model that cannot be placed."""
    stored = {p.model_id: p for p in ModelProfile.objects.filter(model__in=models)}
    out: dict[str, PlacerProfile | None] = {}
    problems: list[str] = []
    for model in models:
        profile = stored.get(model.pk)
        if profile is None:
            out[model.name] = None
            continue
        if (profile.slo_ttft_p99_ms, profile.slo_tbt_p99_ms) != (model.slo_ttft_p99_ms, model.slo_tbt_p99_ms):
            problems.append(
                f"the profile of {model.name} was measured against P99 TTFT {profile.slo_ttft_p99_ms} ms / "
                f"TBT {profile.slo_tbt_p99_ms} ms, but its SLO is now {model.slo_ttft_p99_ms} ms / "
                f"{model.slo_tbt_p99_ms} ms; profile it again"
            )
            continue
        try:
            out[model.name] = model_profile_from_dict(profile.data, model.tensor_parallel_size, burst_level)
        except (ProfilingError, PlacementError) as exc:
            problems.append(f"{model.name}: {exc}")
    try:
        placed = require_profiles([m.name for m in models if m.name in out], out)
    except PlacementError as exc:
        problems.insert(0, f"{exc} (run a profile job for each)")
        placed = []
    if problems:
        raise PlacementError("; ".join(problems))
    return placed


def run_place(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The `place` job's runner (params validated by jobs.kinds.place.PlaceParams)."""
    names = params.get("models") or []
    models = list(ServedModel.objects.order_by("name"))
    if names:
        unknown = sorted(set(names) - {m.name for m in models})
        if unknown:
            raise PlacementError(f"unknown models: {', '.join(unknown)}")
        models = [m for m in models if m.name in names]
    if not models:
        raise PlacementError("no registered models to place")
    profiles = profiles_for(models, float(params.get("burst_level", 4.0)))
    specs = servers()
    if not specs:
        raise PlacementError("no hosts with GPU devices to place on")
    config = PlacerConfig(time_limit_s=float(params.get("time_limit_s", 10.0)))
    ctx.progress(0.05)
    before = fingerprint()
    current = current_placement({m.name for m in models})
    try:
        plan = get_placer(params.get("solver", "cp-sat"), config).place(
            profiles, specs, progress=progress_fn(ctx, 0.05, 0.95), should_cancel=cancel_fn(ctx)
        )
    except PlacementCancelled:
        raise JobCancelled(job_id_of(ctx)) from None
    plan, moves = fewest_moves(current, plan)
    result = {"plan": plan.to_dict(), "moves": [m.to_dict() for m in moves], "fingerprint": before}
    store_plan(job_id_of(ctx), result)
    return result


@transaction.atomic
def store_plan(job_id: int | None, result: dict[str, Any]) -> PlacementPlan | None:
    """Keep the plan for applying, unless the job was cancelled meanwhile."""
    if job_id is None:
        return None
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.status != JobStatus.RUNNING:
        raise JobCancelled(job_id)
    plan, _ = PlacementPlan.objects.update_or_create(
        job=job,
        defaults={"plan": result["plan"], "moves": result["moves"], "fingerprint": result["fingerprint"]},
    )
    return plan
