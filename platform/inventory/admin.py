from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from core.secret_admin import IssuedSecretAdmin
from inventory.models import AgentToken, Device, Host, lock_devices_for_delete, lock_hosts_for_delete
from inventory.services import agent_tokens_revoked


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "address", "status", "last_seen_at", "simulated")
    # Reported by the host's agent (register) and by the liveness sweep: an edit here would be
    # overwritten, and an interval set by hand (unbounded) could keep a dead host online.
    readonly_fields = ("status", "last_seen_at", "heartbeat_interval_s")
    inlines = [DeviceInline]

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
