from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest

from core.ascii_forms import AsciiDigitsAdmin
from core.locked_delete_admin import LockedDeleteAdmin
from core.secret_admin import IssuedSecretAdmin
from inventory.models import AgentToken, Device, Host, lock_devices_for_delete, lock_hosts_for_delete
from inventory.services import agent_tokens_revoked


class DeviceFormSet(BaseInlineFormSet):
    def clean(self) -> None:
        """Refuse deleting a device a deployment uses, as the agent's register keeps it: the
        deployment's devices lost it silently (a running one was sent to its agent on fewer devices
        than its tensor-parallel size, or, with none left, a desired list the link failed on).

        Checked under the host's row lock, held until the admin's transaction (its whole change
        form) ends, as placing a deployment holds it: a deployment placed on the device after an
        unlocked check made ``Device.delete`` refuse at save, a 500 (ProtectedError)."""
        super().clean()
        if self.deleted_forms and self.instance.pk is not None:
            lock_hosts_for_delete([self.instance.pk])
        for form in self.deleted_forms:
            device = form.instance
            if device.pk is None:
                continue
            used = sorted(device.deployments.values_list("pk", flat=True))
            if used:
                raise ValidationError(
                    f"Device {device.index} ({device.uuid}) is used by deployment(s) "
                    f"{', '.join(map(str, used))}: delete those first."
                )


class DeviceInline(AsciiDigitsAdmin, admin.TabularInline):
    """A host's devices, as its agent registered them: shown, not edited (the agent's next
    register overwrites them, and a changed index or host moved a running deployment's engine
    without its agent being told). A device no deployment uses may be deleted."""

    model = Device
    formset = DeviceFormSet
    extra = 0
    readonly_fields = ("index", "uuid", "name", "kind", "memory_total_bytes", "nvlink_peers")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # devices come from the host's agent


@admin.register(Host)
class HostAdmin(LockedDeleteAdmin):
    list_display = ("name", "address", "status", "last_seen_at", "simulated")
    # Reported by the host's agent (register) and by the liveness sweep: an edit here would be
    # overwritten, and an interval set by hand (unbounded) could keep a dead host online.
    readonly_fields = ("status", "last_seen_at", "heartbeat_interval_s")
    inlines = [DeviceInline]

    def lock_for_delete(self, pks: list[Any]) -> None:
        lock_hosts_for_delete(pks)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        """The bulk delete locks the hosts, then their devices first, as ``Host.delete`` does."""
        with transaction.atomic():
            lock_hosts_for_delete(queryset.values_list("pk", flat=True))
            lock_devices_for_delete(Device.objects.filter(host__in=queryset).values_list("pk", flat=True))
            super().delete_queryset(request, queryset)


@admin.register(AgentToken)
class AgentTokenAdmin(IssuedSecretAdmin):
    holder_field = "host"
    list_display = ("host", "prefix", "created_at", "revoked")
    readonly_fields = ("prefix", "digest", "created_at")

    def save_model(self, request: HttpRequest, obj: AgentToken, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and "revoked" in form.changed_data and obj.revoked:
            # Close the agent connections that authenticated with it now, as issuing a new token does.
            agent_tokens_revoked.send(sender=AgentToken, host_id=obj.host_id, token_ids=[obj.pk])
