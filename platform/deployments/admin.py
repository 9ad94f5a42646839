from __future__ import annotations

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from deployments.models import Deployment, lock_for_delete
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

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        """The bulk delete locks the deployments' rows first, as ``Deployment.delete`` does."""
        with transaction.atomic():
            lock_for_delete(queryset.values_list("pk", flat=True))
            super().delete_queryset(request, queryset)

    def save_model(self, request: HttpRequest, obj: Deployment, form: ModelForm, change: bool) -> None:
        update_deployment(obj, desired_state=form.cleaned_data["desired_state"])
