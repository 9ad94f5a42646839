"""Deployment operations: validated creation/update and agent state reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from inventory.models import Device, Host
from registry.models import ServedModel

from deployments.models import ENGINE_UP, Deployment, DesiredState, ObservedState, lock_for_delete


class PlacementError(ValueError):
    """The requested devices cannot hold the model: ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_placement(
    model: ServedModel, host: Host, devices: Sequence[Device], *, exclude: Deployment | None = None
) -> None:
    """Raise ``PlacementError`` unless ``devices`` are distinct devices of ``host``, as many as the
    model's tensor-parallel size, and not used by another deployment meant to run."""
    ids = [device.pk for device in devices]
    if len(set(ids)) != len(ids):
        raise PlacementError("devices", "A device is listed twice.")
    foreign = sorted(device.uuid for device in devices if device.host_id != host.pk)
    if foreign:
        raise PlacementError("devices", f"Devices not on host {host.name}: {', '.join(foreign)}.")
    if len(devices) != model.tensor_parallel_size:
        raise PlacementError(
            "devices",
            f"Model {model.name} needs {model.tensor_parallel_size} device(s) (its tensor-parallel size); "
            f"got {len(devices)}.",
        )
    busy = Deployment.objects.filter(devices__in=ids, desired_state=DesiredState.RUNNING)
    if exclude is not None:
        busy = busy.exclude(pk=exclude.pk)
    # Named by id too: two deployments of one model on one host read alike as model@host.
    taken = [
        f"deployment {d.pk} ({d})" for d in busy.distinct().select_related("model", "host").order_by("pk")
    ]
    if taken:
        raise PlacementError("devices", f"Devices already used by: {', '.join(taken)}.")


def _lock_host(host_id: int) -> bool:
    """Serialise placements on one host until the transaction ends: the device check and the write
    must not interleave with another request's, or two deployments could take the same devices.
    A row lock on PostgreSQL; on SQLite (the single-process development database) it does nothing.
    Returns whether the host still exists."""
    return Host.objects.select_for_update().filter(pk=host_id).first() is not None


def _hold_placement_rows(model: ServedModel, host: Host, devices: Sequence[Device]) -> None:
    """Before a deployment of ``model`` is written onto ``devices`` of ``host`` (held by
    `_lock_host`): raise ``PlacementError`` when one of them was deleted since the request read
    it, and keep the model from being deleted until the transaction ends.

    Writing the deployment anyway failed on its foreign keys (IntegrityError: a 500), or, on a
    model deleted before this transaction began, reading its size did (DoesNotExist). The model
    row is locked FOR KEY SHARE, as the insert's own foreign-key check would lock it, only
    earlier: a model delete holding the row (``registry.models.lock_for_delete``) is waited for and
    then seen; one that comes later waits for this deployment, and refuses to delete a model in
    use (409). FOR KEY SHARE lets an edit of the model (FOR NO KEY UPDATE) go on. A device is
    deleted by its host's agent registering without it, which holds the host's row first (the
    ``Host`` update of ``agents.services.register``), or with its host, which ``Host.delete``
    locks first: either committed before the host's lock here was granted, and is seen."""
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(ServedModel._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE", [model.pk])
            model_exists = cursor.fetchone() is not None
    else:
        model_exists = ServedModel.objects.filter(pk=model.pk).exists()
    if not model_exists:
        raise PlacementError("model", f"Model {model.name} was deleted meanwhile.")
    ids = [device.pk for device in devices]
    present = set(Device.objects.filter(pk__in=ids).values_list("pk", flat=True))
    gone = sorted(device.uuid for device in devices if device.pk not in present)
    if gone:
        raise PlacementError("devices", f"Devices deleted meanwhile (by their agent): {', '.join(gone)}.")


def _lock_all_hosts() -> None:
    """`_lock_host` for every host, in pk order (the order a plan apply takes them in)."""
    list(Host.objects.select_for_update().order_by("pk").values_list("pk", flat=True))


# What the agent link writes; an edit re-reads these instead of writing back a stale copy.
_OBSERVED_FIELDS = ("observed_state", "observed_message", "observed_at", "restart_from")

# The model's settings in the engine spec the agent runs (agents.services.desired_deployments
# sends them as its ModelSpec): the agent restarts an engine when any of them changes.
ENGINE_SETTINGS = ("name", "source", "dtype", "tensor_parallel_size", "max_context_length", "engine_options")


def engine_settings(model: ServedModel) -> dict[str, Any]:
    """``model``'s values of `ENGINE_SETTINGS` (JSON values, as ``restart_from`` keeps them)."""
    return {name: getattr(model, name) for name in ENGINE_SETTINGS}


def _engine_spec(devices: list[int], settings: dict[str, Any]) -> dict[str, Any]:
    """What the agent runs a deployment's engine with: ``{"devices": [index, ...], "model": {...}}``."""
    return {"devices": devices, "model": settings}


@transaction.atomic
def create_deployment(
    model: ServedModel, host: Host, devices: Sequence[Device], desired_state: str = DesiredState.RUNNING
) -> Deployment:
    if not _lock_host(host.pk):
        raise PlacementError("host", f"Host {host.name} was deleted meanwhile.")
    _hold_placement_rows(model, host, devices)
    # Read under the host lock: a tensor-parallel size edit holds every host until it commits.
    model.refresh_from_db(fields=["tensor_parallel_size"])
    check_placement(model, host, devices)
    deployment = Deployment(model=model, host=host, desired_state=desired_state)
    _settle_stop(deployment)  # created stopped: the agent never runs it, so it never reports it
    deployment.save()
    deployment.devices.set(devices)
    return deployment


@transaction.atomic
def update_deployment(
    deployment: Deployment,
    *,
    devices: Sequence[Device] | None = None,
    desired_state: str | None = None,
) -> Deployment:
    """Change the devices and/or desired state; the model and host of a deployment are fixed.

    Only these fields are written: the observed ones of ``deployment`` may be older than what the
    agent reported since it was loaded, and are re-read under the row lock first."""
    _lock_host(deployment.host_id)
    Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
    deployment.refresh_from_db(fields=[*_OBSERVED_FIELDS])
    if desired_state is not None:
        deployment.desired_state = desired_state
    fields = ["desired_state", "updated_at"]
    if devices is not None or deployment.desired_state == DesiredState.RUNNING:
        chosen = list(devices) if devices is not None else list(deployment.devices.order_by("index"))
        model = ServedModel.objects.get(pk=deployment.model_id)  # as of now, under the host lock
        if devices is not None:
            _hold_placement_rows(model, deployment.host, chosen)
        check_placement(model, deployment.host, chosen, exclude=deployment)
        if devices is not None:
            before = sorted(deployment.devices.values_list("index", flat=True))
            deployment.devices.set(chosen)
            settings = engine_settings(model)
            fields += _await_restart(
                deployment,
                _engine_spec(before, settings),
                _engine_spec(sorted(d.index for d in chosen), settings),
            )
    fields += _settle_stop(deployment)
    deployment.save(update_fields=sorted(set(fields)))
    return deployment


def check_tensor_parallel_change(model: ServedModel, old: int, new: int) -> None:
    """Raise ``PlacementError`` on ``tensor_parallel_size`` for a change of ``model``'s size from
    ``old`` to ``new`` while deployments of it are meant to run: each holds exactly ``old``
    devices, and its agent would restart the engine on too few or too many. Stopped ones hold none.

    Binding only under the locks `await_model_restart` takes for the change; called before them
    (a form's or a serializer's validation), it answers early but a deployment started meanwhile
    gets past it."""
    if new == old:
        return
    running = Deployment.objects.filter(model=model, desired_state=DesiredState.RUNNING)
    pks = sorted(running.values_list("pk", flat=True))
    if pks:
        raise PlacementError(
            "tensor_parallel_size",
            f"Deployment(s) {', '.join(map(str, pks))} run this model on {old} device(s); "
            f"stop them before changing its tensor-parallel size to {new}.",
        )


@transaction.atomic
def await_model_restart(model: ServedModel, before: dict[str, Any]) -> list[int]:
    """``model``'s `engine_settings` change from ``before`` to its current (unsaved) values: the
    agents will restart its engines, as on a device edit (see `_await_restart`). A change of other
    fields (the SLOs) restarts nothing and changes nothing here. Returns the pks of the
    deployments whose observed state changed.

    Call it in the edit's transaction before saving ``model``, under a ``FOR NO KEY UPDATE`` lock
    of its row: the locks here come in the order every deployment writer takes them (the hosts,
    then the deployment rows), and a plan apply holding them may still insert a deployment of
    ``model``, whose foreign-key check needs a ``FOR KEY SHARE`` lock of the model row. A save
    that renames the model takes ``FOR UPDATE``, which would block that check; once the hosts are
    held here, no apply can be halfway through them.

    A change of the tensor-parallel size holds every host instead, since a deployment of
    ``model`` may start on any of them, and is refused under those locks while deployments of
    ``model`` run (`check_tensor_parallel_change`): every deployment writer holds its host, so
    each has committed (and is seen) or waits for this transaction. Raises ``PlacementError``
    before writing anything."""
    after = engine_settings(model)
    if after == before:
        return []
    models_deployments = Deployment.objects.filter(model=model)
    old_size, new_size = before["tensor_parallel_size"], after["tensor_parallel_size"]
    if new_size != old_size:
        _lock_all_hosts()
        check_tensor_parallel_change(model, old_size, new_size)
    else:
        for host_id in models_deployments.order_by("host_id").values_list("host_id", flat=True).distinct():
            _lock_host(host_id)
    changed = []
    # Locked like a status report locks its deployment: a report waits for this, or this for it.
    # A deployment created since the hosts were read is locked by its row only: its writer has
    # committed, and nothing is waited for past this point.
    for deployment in models_deployments.select_for_update().order_by("pk"):
        devices = sorted(deployment.devices.values_list("index", flat=True))
        pending, legacy = deployment.restart_from, False
        if pending is not None and "model" not in pending:
            # Kept before model edits were guarded: the engine it waits for runs the settings
            # from before this edit (no model edit since, or it would carry them).
            deployment.restart_from, legacy = {**pending, "model": before}, True
        fields = _await_restart(deployment, _engine_spec(devices, before), _engine_spec(devices, after))
        if legacy:
            fields = sorted({*fields, "restart_from"})
        if fields:
            Deployment.objects.filter(pk=deployment.pk).update(**{f: getattr(deployment, f) for f in fields})
            changed.append(deployment.pk)
    return changed


def _await_restart(deployment: Deployment, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The engine spec (`_engine_spec`) changed from ``before`` to ``after``: the agent will stop
    the engine and start one with the new spec (it restarts an engine only when its spec changed).
    Until it reports doing so, the engine it runs is the old one, whatever it says. Returns the
    fields changed."""
    if before == after:
        return []
    pending = deployment.restart_from
    if pending is not None:
        # Kept before model edits were guarded: only a device edit could have set it, and no model
        # edit has met it since (`await_model_restart` fills "model" in), so the settings are
        # today's.
        old = _engine_spec(pending["devices"], pending.get("model", after["model"]))
        if old != after:  # still the same old engine to wait for
            deployment.observed_message = _restart_message(old, after)
            return ["observed_message"]
        # Undone before the agent acted: it keeps the old engine and will report nothing new.
        deployment.observed_state, deployment.observed_message = pending["state"], pending["message"]
        deployment.restart_from = None
        return [*_OBSERVED_FIELDS]
    if deployment.observed_state not in (*ENGINE_UP, ObservedState.UNKNOWN):
        return []  # no engine up: whatever the agent reports next is about the new spec
    deployment.restart_from = {
        **before,
        "state": deployment.observed_state,
        "message": deployment.observed_message,
    }
    deployment.observed_state = ObservedState.PENDING
    deployment.observed_message = _restart_message(before, after)
    deployment.observed_at = timezone.now()
    return [*_OBSERVED_FIELDS]


def _restart_message(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What changed between the engine the agent runs (``old``) and the one it must run (``new``)."""
    parts = []
    if old["devices"] != new["devices"]:
        # Indices, as the agent and the dashboard's deploy form name GPUs: the API's `devices` are
        # device ids, and "devices changed from [1, 2] to [3, 4]" read as ids beside them.
        parts.append(f"GPU indices changed from {old['devices']} to {new['devices']}")
    settings = [name for name in ENGINE_SETTINGS if old["model"].get(name) != new["model"].get(name)]
    if settings:
        parts.append(f"model settings changed ({', '.join(settings)})")
    return "; ".join([*parts, "waiting for the agent to restart"])


def _settle_stop(deployment: Deployment) -> list[str]:
    """A deployment meant to stop whose agent has no engine of it (it never reported one, or it
    refused it) is stopped now: the agent has nothing to stop, so no report will come. One that
    failed while running is stopped by the agent, which reports it. Returns the fields changed."""
    if (
        deployment.desired_state != DesiredState.STOPPED
        or deployment.observed_state not in (ObservedState.PENDING, ObservedState.FAILED)
        or deployment.restart_from is not None
    ):
        return []
    deployment.observed_state, deployment.observed_message = ObservedState.STOPPED, ""
    deployment.observed_at = timezone.now()
    return ["observed_state", "observed_message", "observed_at"]


def report_observed_state(deployment: Deployment, state: ObservedState, message: str = "") -> Deployment:
    """Record what the agent reports (called from the agent link with ``deployment`` read under a
    row lock). While a change of the engine's spec (a device edit, a model edit) awaits the
    engine's restart, a `running` is the old engine's: it is kept as the state to restore, not
    shown; any other report ends the wait."""
    pending = deployment.restart_from
    changes: dict[str, object]
    if pending is not None and state == ObservedState.RUNNING:
        changes = {"restart_from": {**pending, "state": state, "message": message}}
    else:
        changes = {
            "observed_state": state,
            "observed_message": message,
            "observed_at": timezone.now(),
            "restart_from": None,
        }
    Deployment.objects.filter(pk=deployment.pk).update(**changes)
    deployment.refresh_from_db()
    return deployment


class DeploymentRunning(ValueError):
    """A deployment meant to run was to be deleted: the operator stops it first, so that deleting
    never takes down an engine serving traffic by surprise. The one message every surface shows."""

    def __init__(self, pk: int) -> None:
        super().__init__(f"Deployment {pk} is meant to run: stop it before deleting it.")
        self.pk = pk


@transaction.atomic
def delete_stopped_deployment(deployment: Deployment) -> None:
    """Delete ``deployment`` if it is meant to be stopped; raise ``DeploymentRunning`` otherwise.

    The one rule for the API's DELETE (409) and the dashboard's Delete (the same message): its
    desired state is read under the host's lock and the row's, in the order every deployment
    writer takes them, so that a Start committed meanwhile is seen."""
    _lock_host(deployment.host_id)
    Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
    deployment.refresh_from_db(fields=["desired_state"])
    if deployment.desired_state != DesiredState.STOPPED:
        raise DeploymentRunning(deployment.pk)
    deployment.delete()


@transaction.atomic
def delete_stopped_deployments(pks: Iterable[int]) -> None:
    """`delete_stopped_deployment` for several (the Django admin's bulk delete): all of them, or,
    if one is meant to run, none (``DeploymentRunning`` names the lowest such pk). Their hosts are
    locked in pk order, then their rows (`lock_for_delete`)."""
    wanted = Deployment.objects.filter(pk__in=list(pks))
    for host_id in wanted.order_by("host_id").values_list("host_id", flat=True).distinct():
        _lock_host(host_id)
    lock_for_delete(wanted.values_list("pk", flat=True))
    running = wanted.exclude(desired_state=DesiredState.STOPPED).order_by("pk").first()
    if running is not None:
        raise DeploymentRunning(running.pk)
    wanted.delete()
