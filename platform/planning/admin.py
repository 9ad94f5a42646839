from __future__ import annotations

from django.contrib import admin

from core.ascii_forms import AsciiDigitsAdmin
from planning.models import ModelProfile, PlacementPlan, ProbeRequest


@admin.register(ModelProfile)
class ModelProfileAdmin(AsciiDigitsAdmin, admin.ModelAdmin):
    list_display = ("model", "backend", "role", "max_rps", "lendable_bytes", "updated_at")


@admin.register(PlacementPlan)
class PlacementPlanAdmin(AsciiDigitsAdmin, admin.ModelAdmin):
    list_display = ("job", "created_at", "applied_at", "applied_by")


@admin.register(ProbeRequest)
class ProbeRequestAdmin(AsciiDigitsAdmin, admin.ModelAdmin):
    list_display = ("probe_id", "host", "status", "created_at", "finished_at")
    list_filter = ("status",)
