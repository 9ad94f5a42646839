from __future__ import annotations

from django.contrib import admin

from deployments.models import Deployment


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("model", "host", "desired_state", "observed_state", "observed_at")
