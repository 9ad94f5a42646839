"""Hosts (one GPU agent each), their devices, and the tokens agents authenticate with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models, transaction

from inventory.validators import validate_host_address


class HostStatus(models.TextChoices):
    ONLINE = "online", "online"
    STALE = "stale", "stale (missed recent heartbeats)"
    OFFLINE = "offline", "offline"


class DeviceKind(models.TextChoices):
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU"


class Host(models.Model):
    """A machine running one GPU agent. ``name`` is the agent's identity."""

    name = models.SlugField(max_length=100, unique=True)
    # Set by the agent's `register` (its --address); the gateway reaches a replica of this host at
    # http://<address>:<port>, the port its agent reports (agents.services.replica_url).
    address = models.CharField(
        max_length=255,
        blank=True,
        validators=[validate_host_address],
        help_text="host name or IP address (no port) the gateway reaches this host's engines on",
    )
    status = models.CharField(max_length=16, choices=HostStatus.choices, default=HostStatus.OFFLINE)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Set by the agent's `register`; null when it did not say (agents before the field: 1 s beats).
    # Liveness waits a few missed beats of it (inventory.services.stale_after_s).
    heartbeat_interval_s = models.FloatField(
        null=True, blank=True, help_text="seconds between the agent's heartbeats, as it registered"
    )
    simulated = models.BooleanField(default=False, help_text="a simulated host for the cluster view")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        with transaction.atomic():
            lock_hosts_for_delete([self.pk])
            lock_devices_for_delete(Device.objects.filter(host=self).values_list("pk", flat=True))
            return super().delete(*args, **kwargs)


def lock_hosts_for_delete(pks: Iterable[Any]) -> None:
    """Lock these hosts' rows FOR UPDATE, in primary-key order, until the caller's transaction
    ends, before a delete looks for the deployments that protect them. Placing a deployment holds
    its host's row (``deployments.services.create_deployment``): one placed meanwhile is committed
    first and refuses the delete (ProtectedError), and one placed later finds the host gone (a
    400). Without it a deploy that took the host's row while the delete held the devices waited
    for a device's row as the delete waited for the host's: PostgreSQL aborted the deploy as a
    deadlock."""
    list(Host.objects.select_for_update().filter(pk__in=list(pks)).order_by("pk").values_list("pk"))


class Device(models.Model):
    """An accelerator (or the CPU, for CPU-only hosts) on a host.

    ``nvlink_peers`` lists the indices of devices on the same host it has an NVLink path to;
    memory lending pairs producers and consumers only along such paths.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=DeviceKind.choices, default=DeviceKind.GPU)
    memory_total_bytes = models.PositiveBigIntegerField()
    nvlink_peers = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["host__name", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="device_unique_index_per_host")]

    def __str__(self) -> str:
        return f"{self.host.name}:{self.index} ({self.name})"

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        """Delete the device unless a deployment uses it (then ``ProtectedError``: deleting it
        took it out of the deployment's devices). Its host's row is held first, as placing a
        deployment holds it, so that a deployment placed meanwhile is seen."""
        with transaction.atomic():
            lock_hosts_for_delete([self.host_id])
            lock_devices_for_delete([self.pk])
            used = sorted(self.deployments.values_list("pk", flat=True))
            if used:
                raise models.ProtectedError(
                    f"Device {self.pk} is used by deployment(s) {', '.join(map(str, used))}.",
                    set(self.deployments.all()),
                )
            return super().delete(*args, **kwargs)


def lock_devices_for_delete(pks: Iterable[Any]) -> None:
    """Lock these devices' rows FOR UPDATE, in primary-key order, until the caller's transaction
    ends, before a delete's cascade deletes their samples. Telemetry retention holds the devices
    it folds FOR KEY SHARE while it deletes their old samples: a cascade that deleted those samples
    first and then waited for the device's row deadlocked with it (PostgreSQL aborted one side).
    A telemetry write waiting on the lock is refused by its foreign key after the delete and drops
    those rows (agents.ingest)."""
    list(Device.objects.select_for_update().filter(pk__in=list(pks)).order_by("pk").values_list("pk"))


class AgentToken(models.Model):
    """A host's agent credential, stored as a digest (see core/secrets.py)."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="agent_tokens")
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.host.name} ({self.prefix}...)"
