"""The `place` job: Aqua placement of every profiled model over every host, as a diff.

Servers are the hosts with GPU devices that are not offline (simulated hosts count; a model running
on an offline host is placed elsewhere), less GPUs whose memory is unknown (registered with 0 bytes:
a unified-memory GPU such as the GB10 of a DGX Spark, whose driver does not report it; the placer
needs each GPU's memory): one `ServerSpec` per host, with its
GPU count, the smallest GPU's memory, and NVLink when every GPU is a peer of every other. GPUs held
by running deployments of models outside the plan are left out (the plan leaves those models
alone), so the placer's GPU i of a host is its i-th free GPU; the stored plan names device indices
and lists each host whole. Models are every model with a profile (the others are left alone, like
models outside the plan, and listed in the result's ``left_out``) or the job's `models`, each with its
current `ModelProfile` at the job's ``burst_level`` (a consumer that needs no swap space at that
level is placed as neutral: GPUs, but no lender and no DRAM fallback; see
`serving.profiler.model_profile_from_dict`); tensor parallelism is the model's
``tensor_parallel_size``; each is only placed on GPUs that hold its share of its weights and one
request's KV (`memory_of`), and one no host's GPUs hold fails the job naming it. Anything wrong
(a model the job names without a profile, a profile measured against
another SLO or tensor-parallel size than the model's current one, a burst level its profile lacks,
an infeasible instance) fails the job with a message naming it, and nothing is stored or applied.

The plan is relabelled for the fewest moves against the deployments meant to run now
(`serving.placement.relabel_for_fewest_moves`); its moves are the diff against them plus a "stop"
for each planned model's second running deployment (a plan runs each model once; applying it stops
those), and it is stored as a `PlacementPlan` with a fingerprint
of those deployments, so that applying it later can tell whether they changed (applying.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from deployments.models import Deployment, DesiredState
from django.db import transaction
from inventory.models import Device, DeviceKind, Host, HostStatus
from jobs.models import Job, JobStatus
from jobs.registry import JobCancelled, JobContext
from registry.models import ServedModel

from planning.jobctx import cancel_fn, job_id_of, progress_fn
from planning.models import ModelProfile, PlacementPlan
from serving.costmodel.config import MODEL_CONFIGS
from serving.placement import ModelProfile as PlacerProfile
from serving.placement import (
    Move,
    PlacementCancelled,
    PlacementError,
    PlacerConfig,
    Plan,
    ServerSpec,
    diff,
    get_placer,
    relabel_for_fewest_moves,
    require_profiles,
)
from serving.profiler import ProfilingError, model_profile_from_dict


def gpus_by_host(
    held: Mapping[str, set[int]] | None = None, *, offline: bool = True
) -> dict[str, list[Device]]:
    """host name -> its GPU devices by index, less the indices `held` lists for it and GPUs whose
    memory is unknown (0 bytes); hosts left without GPUs (and, with ``offline=False``, offline
    hosts) are omitted. Ordered by host name."""
    held = held or {}
    out: dict[str, list[Device]] = {}
    hosts = Host.objects.prefetch_related("devices").order_by("name")
    if not offline:
        hosts = hosts.exclude(status=HostStatus.OFFLINE)
    for host in hosts:
        gpus = sorted(
            (
                d
                for d in host.devices.all()
                if d.kind == DeviceKind.GPU
                and d.memory_total_bytes > 0
                and d.index not in held.get(host.name, ())
            ),
            key=lambda d: d.index,
        )
        if gpus:
            out[host.name] = gpus
    return out


def _hosts_with_gpus_of_unknown_memory() -> list[str]:
    """Names of the hosts with a GPU registered with 0 bytes of memory (gpus_by_host leaves it out)."""
    hosts = Host.objects.filter(devices__kind=DeviceKind.GPU, devices__memory_total_bytes=0)
    return sorted(set(hosts.values_list("name", flat=True)))


def _spec(name: str, gpus: list[Device], num_gpus: int | None = None) -> ServerSpec:
    indices = {d.index for d in gpus}
    nvlink = all(indices - {d.index} <= set(d.nvlink_peers or []) for d in gpus)
    return ServerSpec(name, num_gpus or len(gpus), min(d.memory_total_bytes for d in gpus), nvlink)


def host_spec(name: str, gpus: list[Device]) -> ServerSpec:
    """A host as a stored plan lists it: whole, its GPUs numbered by device index (`gpus`, all of
    them, by index), so num_gpus covers the highest. Applying a plan compares it with the host's
    now (planning/applying.py)."""
    return _spec(name, gpus, gpus[-1].index + 1)


def held_gpus(planned: set[str]) -> dict[str, set[int]]:
    """host name -> indices of the devices that running deployments of models outside `planned`
    use (a plan of `planned` must leave them alone)."""
    held: dict[str, set[int]] = {}
    for d in running_deployments():
        if d.model.name not in planned:
            held.setdefault(d.host.name, set()).update(dev.index for dev in d.devices.all())
    return held


def _in_placer_numbers(
    current: dict[str, tuple[str, list[int]]], indices: Mapping[str, list[int]]
) -> dict[str, tuple[str, list[int]]]:
    """`current` with device indices as the placer numbers GPUs (a host's i-th free GPU is its GPU
    i); a model on a host the placer does not see, or on GPUs it does not, cannot stay put."""
    out = {}
    for model, (host, gpus) in current.items():
        free = indices.get(host)
        if free is not None and set(gpus) <= set(free):
            out[model] = (host, [free.index(g) for g in gpus])
    return out


def _to_device_gpus(plan: Plan, indices: Mapping[str, list[int]], whole: Mapping[str, ServerSpec]) -> Plan:
    """`plan` with the placer's GPU numbers as device indices, and each server as the whole host."""

    def on(server: str, gpus: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(indices[server][g] for g in gpus))

    return replace(
        plan,
        assignments={m: replace(a, gpus=on(a.server, a.gpus)) for m, a in plan.assignments.items()},
        pairings=tuple(
            replace(p, lender_gpus=on(p.server, p.lender_gpus), borrower_gpus=on(p.server, p.borrower_gpus))
            for p in plan.pairings
        ),
        dram_fallbacks=tuple(replace(f, gpus=on(f.server, f.gpus)) for f in plan.dram_fallbacks),
        servers=tuple(whole[s.name] for s in plan.servers),
    )


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


def second_deployments(planned: set[str]) -> list[Deployment]:
    """The running deployments of `planned` models after each one's first (by id): a plan places
    each model once, so applying it stops these (planning/applying.py)."""
    seen: set[str] = set()
    out: list[Deployment] = []
    for d in running_deployments():
        if d.model.name in planned:
            if d.model.name in seen:
                out.append(d)
            seen.add(d.model.name)
    return out


def stop_moves(deployments: list[Deployment]) -> list[Move]:
    """The "stop" moves of `deployments` (a model's second deployments), as a plan's moves list them."""
    return [
        Move(d.model.name, "stop", d.host.name, tuple(sorted(dev.index for dev in d.devices.all())), None, ())
        for d in deployments
    ]


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
        if profile.tensor_parallel_size not in (None, model.tensor_parallel_size):
            problems.append(
                f"the profile of {model.name} was measured at tensor-parallel size "
                f"{profile.tensor_parallel_size}, but its size is now {model.tensor_parallel_size}; "
                "profile it again"
            )
            continue
        # The profile belongs to the model (its row), whatever the model was called when profiled:
        # the name stored in its data is that older name after a rename.
        data = {**profile.data, "model": model.name}
        try:
            view = model_profile_from_dict(data, model.tensor_parallel_size, burst_level)
            out[model.name] = replace(view, **memory_of(model, data))
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


def memory_of(model: ServedModel, data: Mapping[str, Any]) -> dict[str, int]:
    """The placer's `weights_bytes` and `min_kv_bytes` of `model` (0 where unknown), so that it is
    only placed on GPUs it can load on: the weights of its cost-model preset (engine_options
    ``sim_model``, else its name when that names a preset; the model's shape, whichever backend
    profiled it), and one request of its context length of KV, at the KV bytes per token of its
    profile's cost model, else of the preset."""
    name = (model.engine_options or {}).get("sim_model") or model.name
    config = MODEL_CONFIGS.get(name) if isinstance(name, str) else None
    cost = data.get("cost_model")
    per_token = cost.get("kv_bytes_per_token") if isinstance(cost, Mapping) else None
    if not isinstance(per_token, int) or per_token <= 0:
        per_token = config.kv_bytes_per_token() if config is not None else 0
    return {
        "weights_bytes": config.weight_bytes() if config is not None else 0,
        "min_kv_bytes": per_token * model.max_context_length,
    }


def run_place(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The `place` job's runner (params validated by jobs.kinds.place.PlaceParams)."""
    names = params.get("models")  # None: every profiled model; [] (refused at POST) places none
    models = list(ServedModel.objects.order_by("name"))
    left_out: list[str] = []  # models without a profile, left alone by a plan of "every model"
    if names is not None:
        unknown = sorted(set(names) - {m.name for m in models})
        if unknown:
            raise PlacementError(f"unknown models: {', '.join(unknown)}")
        models = [m for m in models if m.name in names]
    else:
        profiled = set(ModelProfile.objects.values_list("model_id", flat=True))
        left_out = [m.name for m in models if m.pk not in profiled]
        models = [m for m in models if m.pk in profiled]
        if not models and left_out:
            raise PlacementError(
                f"no model has a profile yet (run a profile job for each: {', '.join(left_out)})"
            )
    if not models:
        raise PlacementError("no registered models to place")
    profiles = profiles_for(models, float(params.get("burst_level", 4.0)))
    planned = {m.name for m in models}
    # Before the first read of the deployments: one made while they are read (an operator's deploy
    # onto a GPU seen free) changes the fingerprint, so Apply refuses the plan as stale. Taken after,
    # it included that deployment and the plan failed half way through applying on a device conflict.
    before = fingerprint()
    held = held_gpus(planned)
    free = gpus_by_host(held, offline=False)  # no engine starts on a host whose agent is gone
    if not free:
        others = " not used by models outside the plan" if held else ""
        down = sorted(set(gpus_by_host()) - set(gpus_by_host(offline=False)))
        offline = f" (offline: {', '.join(down)})" if down else ""
        unknown = _hosts_with_gpus_of_unknown_memory()
        left = f" (memory unknown, left out: {', '.join(unknown)})" if unknown else ""
        raise PlacementError(f"no hosts with GPU devices{others} to place on{offline}{left}")
    specs = [_spec(name, gpus) for name, gpus in free.items()]
    # host -> device index of the placer's GPU 0, 1, ...; and each host whole (for the stored plan,
    # whose GPU numbers are device indices: num_gpus covers the highest)
    indices = {name: [d.index for d in gpus] for name, gpus in free.items()}
    whole = {name: host_spec(name, gpus) for name, gpus in gpus_by_host().items()}
    config = PlacerConfig(time_limit_s=float(params.get("time_limit_s", 10.0)))
    ctx.progress(0.05)
    current = current_placement(planned)
    try:
        plan = get_placer(params.get("solver", "cp-sat"), config).place(
            profiles, specs, progress=progress_fn(ctx, 0.05, 0.95), should_cancel=cancel_fn(ctx)
        )
    except PlacementCancelled:
        raise JobCancelled(job_id_of(ctx)) from None
    plan = relabel_for_fewest_moves(_in_placer_numbers(current, indices), plan)
    plan = _to_device_gpus(plan, indices, whole)
    # What Apply does: the moves to the plan, then stopping planned models' second deployments
    # (without them, a plan that stops a replica showed no change for its model).
    moves = diff(current, plan) + stop_moves(second_deployments(planned))
    result = {
        "plan": plan.to_dict(),
        "moves": [m.to_dict() for m in moves],
        "fingerprint": before,
        "left_out": left_out,  # not profiled: the plan neither moves nor stops them
    }
    # Stored as the job finishes, in the transaction that marks it succeeded (JobContext.on_success).
    ctx.on_success(partial(store_plan, job_id_of(ctx), result, {m.name: m.pk for m in models}))
    return result


@transaction.atomic
def store_plan(
    job_id: int | None, result: dict[str, Any], model_ids: dict[str, int] | None = None
) -> PlacementPlan | None:
    """Keep the plan for applying, unless the job was cancelled meanwhile; `model_ids` maps the
    name of each model placed to its id. The place job's outcome: run in the transaction that
    marks the job succeeded."""
    if job_id is None:
        return None
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.status != JobStatus.RUNNING:
        raise JobCancelled(job_id)
    plan, _ = PlacementPlan.objects.update_or_create(
        job=job,
        defaults={
            "plan": result["plan"],
            "moves": result["moves"],
            "fingerprint": result["fingerprint"],
            "model_ids": model_ids or {},
        },
    )
    return plan
