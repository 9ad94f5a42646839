from __future__ import annotations

from django.contrib import admin

from inventory.models import AgentToken, Device, Host


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "address", "status", "last_seen_at", "simulated")
    inlines = [DeviceInline]


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ("host", "prefix", "created_at", "revoked")
    readonly_fields = ("prefix", "digest", "created_at")
