"""Applying a stored placement plan to deployments, with the fewest changes, in one transaction.

What changes (for the plan's models only; others are left alone):
  stop   a running deployment whose model the plan does not place there, and any second running
         deployment of a planned model (a plan places each model once): desired state -> stopped;
  move   on the same host: the deployment's devices change; to another host: the old deployment
         stops and the model starts there (a deployment's host is fixed);
  start  the model's stopped deployment on that host is reused (devices set, desired running), or a
         new deployment is created.
Stops come first, so that devices freed by one model can be taken by another in the same apply.
Agents converge because deployment saves notify the host's link (agents/signals.py) and every link
re-reads its desired list periodically.

Applying is idempotent: when the deployments already match the plan nothing changes, and the plan
is not marked applied (applied_at/applied_by say who changed the deployments with it: an apply that
found them matching, its moves made by hand or by a twin plan, changed nothing, and its answer says
"already match" each time, not "already applied by" someone who applied nothing). A plan is
applied once: once it changed the deployments, applying it again changes nothing, even when they
were changed back by hand to what it was computed on (its fingerprint matches again); a new place
job plans against them. A
plan computed against deployments that have changed since (another apply, an operator's edit) is
refused as stale, and so is one whose hosts, GPUs or models are gone, one that starts or moves a
model to a host whose GPUs changed since (their number, the smallest one's memory or NVLink: the
plan sized its models for the GPUs it saw), one that starts or moves a model to a host that is
offline now (its agent is gone: the model would not run there), one that starts or moves a model
to GPUs that no longer hold its share of weights and one request's KV (the place job's fit, checked
again against the model's settings, its profile and the GPUs as they are now: a context length,
preset or profile that grew since, or a host registered again with smaller GPUs), or one of
whose model names now belongs to another model than the one it was computed for. Applies take
every host's row lock first (the lock deployment writes take, in host order), so two applies run
one after the other and the second sees the first's deployments; either every change is made or
none. `preview` runs the same checks without writing, for the dashboard, which offers no Apply for a
plan an apply would refuse or that would change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployments import services as deployments
from deployments.models import Deployment, DesiredState
from django.db import transaction
from django.utils import timezone
from inventory.models import Device, DeviceKind, Host, HostStatus
from jobs.models import Job, JobStatus
from registry.models import ServedModel

from planning.models import ModelProfile, PlacementPlan
from planning.placing import (
    current_placement,
    fingerprint,
    gpus_by_host,
    host_spec,
    memory_of,
    running_deployments,
    second_deployments,
    stop_moves,
)
from serving.placement import Plan, ServerSpec, diff


class PlanNotApplicable(Exception):
    """The job is not a succeeded place job with a stored plan."""


class PlanConflict(Exception):
    """The plan cannot be applied now (stale, or the deployments refuse it); nothing changed."""


@dataclass
class ApplyOutcome:
    applied: bool  # False: the deployments already matched the plan
    moves: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""


def _not_a_succeeded_place_job(job: Job) -> str | None:
    """Why ``job``'s plan is not applicable for the job's own sake (None: a succeeded place job).
    A place job's plan is stored in the transaction that marks it succeeded, so only a plan stored
    by an older version (before one a cancel or a killed worker could leave behind) belongs to a
    job that is not."""
    if job.kind != "place" or job.status != JobStatus.SUCCEEDED:
        return f"job {job.pk} is a {job.status} {job.kind} job, not a succeeded place job"
    return None


def _plan_of(job: Job) -> tuple[PlacementPlan, Plan]:
    why = _not_a_succeeded_place_job(job)
    if why is not None:
        raise PlanNotApplicable(why)
    row = PlacementPlan.objects.select_for_update().filter(job=job).first()
    if row is None:
        raise PlanNotApplicable(f"job {job.pk} has no stored plan")
    try:
        return row, Plan.from_dict(row.plan)
    except ValueError as exc:  # stored by an older version in another shape
        raise PlanNotApplicable(
            f"job {job.pk}'s stored plan cannot be read ({exc}); run a new place job"
        ) from None


@transaction.atomic
def apply_plan(job: Job, user: Any) -> ApplyOutcome:
    """Apply the plan of place job `job` (see the module docstring).

    Raises:
        PlanNotApplicable: not a succeeded place job with a plan.
        PlanConflict: the deployments changed since the plan was computed, a model, host or GPU
            of the plan is gone, a model no longer fits the GPUs the plan gives it, or the
            deployments refuse a change; nothing changed.
    """
    row, plan = _plan_of(job)  # the plan's row is locked: a concurrent apply waits, then sees it
    if row.applied_at is not None:
        by = f" by {row.applied_by}" if row.applied_by else ""
        return ApplyOutcome(
            False,
            [],
            f"This plan was already applied{by}; nothing changed. "
            "Run a new place job to change the placement.",
        )
    _lock_hosts()
    checked = _check(row, plan)
    if checked is None:  # not marked applied: nothing was (the module docstring)
        return ApplyOutcome(False, [], "The deployments already match this plan; nothing changed.")
    moves, extras, targets = checked
    done = [m.to_dict() for m in moves + stop_moves(extras)]  # as the place job listed them
    try:
        _execute(moves, extras, targets)
    except deployments.PlacementError as exc:
        transaction.set_rollback(True)
        raise PlanConflict(f"The deployments refused the plan: {exc}") from None
    row.applied_at, row.applied_by = timezone.now(), user
    row.save(update_fields=["applied_at", "applied_by"])
    return ApplyOutcome(True, done, f"Applied {len(done)} change(s).")


@dataclass(frozen=True)
class Preview:
    """What an Apply of a stored plan would do as of now (see `preview`)."""

    refusal: str | None  # why `apply_plan` would refuse it; None: it would not
    changes: bool  # it would change deployments; False: refused, applied before, or already in effect


def preview(row: PlacementPlan) -> Preview:
    """What `apply_plan` would do with ``row``'s plan as of now: refuse it (its `PlanConflict`
    message, or why it is `PlanNotApplicable`: its job did not succeed, the plan cannot be read),
    change deployments, or change nothing (applied before, or the deployments already match it: a
    plan with no moves, or deployments changed to it since).
    Read without locks, for a page that offers Apply only where it would change something: an apply
    decides again under its locks, and the deployments may still refuse a change then."""
    if row.applied_at is not None:
        return Preview(None, False)
    why = _not_a_succeeded_place_job(row.job)
    if why is not None:
        return Preview(f"{why[:1].upper()}{why[1:]}; run a new place job.", False)
    try:
        plan = Plan.from_dict(row.plan)
    except ValueError as exc:  # stored by an older version in another shape
        return Preview(f"The stored plan cannot be read ({exc}); run a new place job.", False)
    try:
        checked = _check(row, plan)
    except PlanConflict as exc:
        return Preview(str(exc), False)
    return Preview(None, checked is not None)


def refusal(row: PlacementPlan) -> str | None:
    """Why `apply_plan` would refuse ``row``'s plan as of now, or ``None`` (see `preview`)."""
    return preview(row).refusal


_Checked = tuple[list[Any], list[Deployment], dict[str, "_Target"]]


def _check(row: PlacementPlan, plan: Plan) -> _Checked | None:
    """What applying ``plan`` (``row``'s) to today's deployments takes: its moves, the second
    running deployments of planned models to stop, and where each started or moved model goes;
    ``None`` when the deployments already match it. Writes nothing.

    Raises:
        PlanConflict: the plan is stale, or refers to models, hosts or GPUs that changed.
    """
    planned = set(plan.assignments)
    _check_same_models(row)
    extras = second_deployments(planned)  # second running deployments of planned models
    moves = diff(current_placement(planned), plan)
    if not moves and not extras:
        return None
    if fingerprint() != row.fingerprint:
        raise PlanConflict(
            "The deployments changed since this plan was computed (another plan was applied or a "
            "deployment was edited); run a new place job."
        )
    return moves, extras, _targets(moves, {s.name: s for s in plan.servers})


def _check_same_models(row: PlacementPlan) -> None:
    """PlanConflict if a model the plan places was renamed, or a name it places now belongs to
    another model than the one it was computed for (that one deleted or renamed, and another
    created or renamed to its name).
    Plans stored before their models' ids were kept are not checked; a model gone altogether is
    refused by `_targets`."""
    stored: dict[str, int] = row.model_ids or {}
    names_now = dict(ServedModel.objects.filter(pk__in=stored.values()).values_list("pk", "name"))
    renamed = sorted(
        f"{name!r} (now {names_now[pk]!r})"
        for name, pk in stored.items()
        if pk in names_now and names_now[pk] != name
    )
    if renamed:
        raise PlanConflict(
            f"Models of the plan were renamed since it was computed: {', '.join(renamed)}; "
            "run a new place job."
        )
    now = dict(ServedModel.objects.filter(name__in=stored).values_list("name", "pk"))
    other = sorted(name for name, pk in stored.items() if name in now and now[name] != pk)
    if other:
        names = ", ".join(repr(name) for name in other)
        raise PlanConflict(
            f"The plan was computed for another model named {names} (deleted or renamed since); "
            "run a new place job."
        )


def _lock_hosts() -> None:
    """Row locks on every host until the transaction ends, taken in one order (no deadlock); a
    no-op on SQLite, whose write transactions are serialised anyway."""
    list(Host.objects.select_for_update().order_by("pk").values_list("pk", flat=True))


@dataclass
class _Target:
    """Where a started or moved model goes, read before anything changes."""

    model: ServedModel
    host: Host
    devices: list[Device]


def _targets(moves: list[Any], servers: dict[str, ServerSpec]) -> dict[str, _Target]:
    """model name -> its target, for every move that starts or re-places a model; ``servers`` are
    the plan's hosts as it saw them (server name -> spec of the whole host).

    Raises:
        PlanConflict: a model, host or GPU of the plan no longer exists, a model it starts or
            moves no longer fits its GPUs, the GPUs of a host it starts or moves a model to
            changed, or such a host is offline.
    """
    names = {m.model for m in moves if m.kind != "stop"}
    models = {m.name: m for m in ServedModel.objects.filter(name__in=names)}
    profiles = dict(
        ModelProfile.objects.filter(model__in=list(models.values())).values_list("model_id", "data")
    )
    hosts = {
        h.name: h for h in Host.objects.filter(name__in={m.to_server for m in moves if m.kind != "stop"})
    }
    out: dict[str, _Target] = {}
    gone: list[str] = []
    offline: list[str] = []
    too_small: list[str] = []
    changed: dict[str, str] = _changed_hosts(set(hosts), servers)  # host name -> how
    for m in moves:
        if m.kind == "stop":
            continue
        model, host = models.get(m.model), hosts.get(m.to_server)
        if model is None:
            gone.append(f"model {m.model!r}")
            continue
        if host is None:
            gone.append(f"host {m.to_server!r}")
            continue
        devices = list(
            Device.objects.filter(host=host, kind=DeviceKind.GPU, index__in=m.to_gpus).order_by("index")
        )
        missing = sorted(set(m.to_gpus) - {d.index for d in devices})
        if missing:
            gone.append(f"GPU {', '.join(map(str, missing))} of host {host.name!r}")
            continue
        too_small += _misfits(model, host, devices, profiles.get(model.pk))
        if host.name in changed:
            continue
        if host.status == HostStatus.OFFLINE:
            offline.append(host.name)
            continue
        out[m.model] = _Target(model, host, devices)
    if gone:
        raise PlanConflict(
            f"The plan refers to what no longer exists: {'; '.join(sorted(set(gone)))}; run a new place job."
        )
    if too_small:
        raise PlanConflict(
            "Models of the plan no longer fit the GPUs it places them on (the model's settings or "
            f"profile, or the host's GPUs, changed since it was computed): {'; '.join(too_small)}; "
            "run a new place job."
        )
    if changed:
        how = "; ".join(f"host {name!r}: {text}" for name, text in sorted(changed.items()))
        raise PlanConflict(
            f"The GPUs of the hosts the plan places models on changed since it was computed ({how}); "
            "run a new place job."
        )
    if offline:
        down = ", ".join(repr(name) for name in sorted(set(offline)))
        raise PlanConflict(
            f"The plan starts models on offline host(s) {down}, whose agent is not connected; "
            "bring the host back online or run a new place job."
        )
    return out


def _misfits(model: ServedModel, host: Host, devices: list[Device], profile: Any) -> list[str]:
    """Each of ``devices`` (``model``'s GPUs on ``host`` in a plan) that does not hold the model's
    share of its weights and one request's KV, as the place job sizes it (`memory_of`, from the
    model and its profile's data ``profile`` as they are now), said as a refusal names it."""
    memory = memory_of(model, profile if isinstance(profile, dict) else {})
    weights, kv, tp = memory["weights_bytes"], memory["min_kv_bytes"], model.tensor_parallel_size
    need = -(-(weights + kv) // tp)
    if need == 0:  # unknown: the place job took any GPU to hold it
        return []
    return [
        f"model {model.name!r} needs {_gib(need)} per GPU (weights {_gib(weights)} + minimal KV cache "
        f"{_gib(kv)} over tp {tp}) but GPU {d.index} of host {host.name!r} has "
        + (_gib(d.memory_total_bytes) if d.memory_total_bytes else "memory of unknown size")
        for d in devices
        if d.memory_total_bytes < need
    ]


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _changed_hosts(names: set[str], servers: dict[str, ServerSpec]) -> dict[str, str]:
    """host name -> how its GPUs differ now from the plan's spec of it, for the hosts in ``names``
    the plan lists (a plan stored without a host's spec is not checked)."""
    now = gpus_by_host()
    out: dict[str, str] = {}
    for name in sorted(names & set(servers)):
        was, gpus = servers[name], now.get(name)
        spec = host_spec(name, gpus) if gpus else None
        if spec != was:
            out[name] = f"was {_describe(was)}, now {_describe(spec)}"
    return out


def _describe(spec: ServerSpec | None) -> str:
    if spec is None:
        return "no GPUs"
    link = "NVLink" if spec.nvlink else "no NVLink"
    return f"{spec.num_gpus} GPU(s), the smallest of {spec.gpu_memory_bytes / 2**30:.4g} GiB, {link}"


def _execute(moves: list[Any], extras: list[Deployment], targets: dict[str, _Target]) -> None:
    running: dict[str, Deployment] = {}
    for d in running_deployments():
        running.setdefault(d.model.name, d)
    # 1. stop what leaves its place, so that its devices are free for the starts below
    for d in extras:
        deployments.update_deployment(d, desired_state=DesiredState.STOPPED)
    for m in moves:
        if m.kind in ("stop", "move"):  # a same-host move is restarted on its new devices in step 2
            deployments.update_deployment(running[m.model], desired_state=DesiredState.STOPPED)
    # 2. start or re-place
    for m in moves:
        if m.kind == "stop":
            continue
        target = targets[m.model]
        if m.kind == "move" and m.from_server == m.to_server:
            deployments.update_deployment(
                running[m.model], devices=target.devices, desired_state=DesiredState.RUNNING
            )
            continue
        reusable = Deployment.objects.filter(
            model=target.model, host=target.host, desired_state=DesiredState.STOPPED
        )
        existing = reusable.order_by("pk").first()
        if existing is not None:
            deployments.update_deployment(
                existing, devices=target.devices, desired_state=DesiredState.RUNNING
            )
        else:
            deployments.create_deployment(target.model, target.host, target.devices)
