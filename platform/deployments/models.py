"""Deployments: a served model on some devices of one host, desired vs observed state.

Operators (or the placer) set ``desired_state``; the host's agent reports ``observed_state`` as
it converges. The two differ while a change is in flight or when the agent failed.
"""

from __future__ import annotations

from django.db import models
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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.host.name}"

    @property
    def converged(self) -> bool:
        return self.desired_state == self.observed_state
