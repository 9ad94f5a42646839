"""Deployments: a served model on some devices of one host, desired vs observed state.

Operators (or the placer) set ``desired_state``; the host's agent reports ``observed_state`` as
it converges. The two differ while a change is in flight or when the agent failed. The control
plane sets it where no report can come: ``unknown`` while the host is offline, ``pending`` while a
change of the engine's spec (its devices, its model's settings) waits for the agent, ``stopped`` for
what the agent has no engine of.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models, transaction
from inventory.models import Device, Host
from registry.models import ServedModel


class DesiredState(models.TextChoices):
    RUNNING = "running", "running"
    STOPPED = "stopped", "stopped"


class ObservedState(models.TextChoices):
    PENDING = "pending", "pending (agent has not reported)"
    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    STOPPING = "stopping", "stopping"
    STOPPED = "stopped", "stopped"
    FAILED = "failed", "failed"
    UNKNOWN = "unknown", "unknown (the host is offline)"


# Observed states that claim an engine is up (or coming up) on the host.
ENGINE_UP = (ObservedState.STARTING, ObservedState.RUNNING)


class Deployment(models.Model):
    model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="deployments")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="deployments")
    devices = models.ManyToManyField(Device, related_name="deployments")
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.RUNNING
    )
    observed_state = models.CharField(
        max_length=16, choices=ObservedState.choices, default=ObservedState.PENDING
    )
    observed_message = models.TextField(blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    # Set when the engine's spec changes while it runs (a device edit, an edit of the model's
    # engine settings): until the agent reports restarting it, a `running` is the old engine's.
    # {"devices": [index, ...], "model": {setting: value}, "state": ..., "message": ...}: the old
    # engine's spec (deployments.services._engine_spec) and its last observed state, restored if
    # the edit is undone in time. Rows from before model edits were guarded lack "model".
    restart_from = models.JSONField(
        null=True,
        blank=True,
        help_text="the engine the agent runs while a change of its spec awaits its restart",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.host.name}"

    @property
    def converged(self) -> bool:
        return self.desired_state == self.observed_state

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        with transaction.atomic():
            lock_for_delete([self.pk])
            return super().delete(*args, **kwargs)


def lock_for_delete(pks: Iterable[Any]) -> None:
    """Lock these deployments' rows FOR UPDATE, in primary-key order, until the caller's transaction
    ends, before a delete's cascade looks for the rows that refer to them. A status storing a first
    replica holds the row (``agents.services.report_status``): it is stored first and deleted with
    the deployment. A row inserted later that refers to it (a telemetry sample) waits for the
    delete and is refused by its foreign key. Either committed between the cascade and the
    deployment's own delete failed the delete at commit."""
    list(Deployment.objects.select_for_update().filter(pk__in=list(pks)).order_by("pk").values_list("pk"))
