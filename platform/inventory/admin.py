from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.secret_admin import IssuedSecretAdmin
from inventory.models import AgentToken, Device, Host
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
