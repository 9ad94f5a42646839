"""Deployment operations: validated creation/update and agent state reports."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone
from inventory.models import Device, Host
from registry.models import ServedModel

from deployments.models import Deployment, DesiredState, ObservedState


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
    taken = sorted({str(d) for d in busy.distinct()})
    if taken:
        raise PlacementError("devices", f"Devices already used by: {', '.join(taken)}.")


def _lock_host(host_id: int) -> None:
    """Serialise placements on one host until the transaction ends: the device check and the write
    must not interleave with another request's, or two deployments could take the same devices.
    A row lock on PostgreSQL; on SQLite (the single-process development database) it does nothing."""
    Host.objects.select_for_update().filter(pk=host_id).first()


@transaction.atomic
def create_deployment(
    model: ServedModel, host: Host, devices: Sequence[Device], desired_state: str = DesiredState.RUNNING
) -> Deployment:
    _lock_host(host.pk)
    check_placement(model, host, devices)
    deployment = Deployment.objects.create(model=model, host=host, desired_state=desired_state)
    deployment.devices.set(devices)
    return deployment


@transaction.atomic
def update_deployment(
    deployment: Deployment,
    *,
    devices: Sequence[Device] | None = None,
    desired_state: str | None = None,
) -> Deployment:
    """Change the devices and/or desired state; the model and host of a deployment are fixed."""
    _lock_host(deployment.host_id)
    if desired_state is not None:
        deployment.desired_state = desired_state
    if devices is not None or deployment.desired_state == DesiredState.RUNNING:
        chosen = list(devices) if devices is not None else list(deployment.devices.order_by("index"))
        check_placement(deployment.model, deployment.host, chosen, exclude=deployment)
        if devices is not None:
            deployment.devices.set(chosen)
    deployment.save()
    return deployment


def report_observed_state(deployment: Deployment, state: ObservedState, message: str = "") -> Deployment:
    """Record what the agent sees (called from the agent link)."""
    Deployment.objects.filter(pk=deployment.pk).update(
        observed_state=state, observed_message=message, observed_at=timezone.now()
    )
    deployment.refresh_from_db()
    return deployment
