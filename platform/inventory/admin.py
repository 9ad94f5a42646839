from __future__ import annotations

from django.contrib import admin

from inventory.models import AgentToken, Device, Host


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
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ("host", "prefix", "created_at", "revoked")
    readonly_fields = ("prefix", "digest", "created_at")
