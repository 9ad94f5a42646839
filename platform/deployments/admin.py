from __future__ import annotations

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from deployments.models import Deployment
from deployments.services import update_deployment


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    """Deployments are placed through the API or the dashboard (`create_deployment`: placement
    checks, host locks); here an admin may only change one's desired state, which goes through
    `update_deployment` like the API's, or delete it."""

    list_display = ("model", "host", "desired_state", "observed_state", "observed_at")
    fields = (
        "model",
        "host",
        "devices",
        "desired_state",
        "observed_state",
        "observed_message",
        "observed_at",
    )
    readonly_fields = ("model", "host", "devices", "observed_state", "observed_message", "observed_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Deployment, form: ModelForm, change: bool) -> None:
        update_deployment(obj, desired_state=form.cleaned_data["desired_state"])
