from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from core.ascii_forms import AsciiDigitsAdmin
from deployments import services
from deployments.models import Deployment, DesiredState
from deployments.services import PlacementError, check_placement, update_deployment


class DeploymentAdminForm(forms.ModelForm):
    class Meta:
        model = Deployment
        fields = ["desired_state"]

    def clean_desired_state(self) -> str:
        """The API's rule, as a form error: a Start on devices another running deployment took is
        refused (`check_placement`; checked again under the locks when saved)."""
        value: str = self.cleaned_data["desired_state"]
        if value == DesiredState.RUNNING and self.instance.pk is not None:
            devices = list(self.instance.devices.order_by("index"))
            try:
                check_placement(self.instance.model, self.instance.host, devices, exclude=self.instance)
            except PlacementError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return value


class PlacementRefusalShown(AsciiDigitsAdmin, admin.ModelAdmin):
    """A save the deployments refuse under their locks (a `PlacementError` after the form's own
    check: another request took the devices, or started a deployment, meanwhile) rolls back the
    admin's transaction and brings the change page back, unchanged, with the reason instead of a
    server error. For the admins of deployments and of models."""

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except PlacementError as exc:
            self.message_user(request, f"Not saved: {exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


@admin.register(Deployment)
class DeploymentAdmin(PlacementRefusalShown):
    """Deployments are placed through the API or the dashboard (`create_deployment`: placement
    checks, host locks); here an admin may only change one's desired state, which goes through
    `update_deployment` like the API's, or delete a stopped one, refused with the API's and the
    dashboard's message (`services.DeploymentRunning`) while it is meant to run."""

    form = DeploymentAdminForm
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

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        found = actions.get("delete_selected")
        if found is not None:
            actions["delete_selected"] = (cast(Any, _delete_selected_stopped), found[1], found[2])
        return actions

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's delete page; for a deployment meant to run, the change page with the refusal
        (before the confirmation, and again if a Start came between it and the post)."""
        deployment = self.get_object(request, unquote(object_id))
        try:
            if deployment is not None and deployment.desired_state != DesiredState.STOPPED:
                raise services.DeploymentRunning(deployment.pk)
            return super().delete_view(request, object_id, extra_context)
        except services.DeploymentRunning as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:deployments_deployment_change", args=[exc.pk]))

    def delete_model(self, request: HttpRequest, obj: Deployment) -> None:
        services.delete_stopped_deployment(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        """The bulk delete: all or none, under the locks `delete_stopped_deployment` takes."""
        services.delete_stopped_deployments(queryset.values_list("pk", flat=True))

    def save_model(self, request: HttpRequest, obj: Deployment, form: ModelForm, change: bool) -> None:
        update_deployment(obj, desired_state=form.cleaned_data["desired_state"])


def _delete_selected_stopped(
    modeladmin: DeploymentAdmin, request: HttpRequest, queryset: QuerySet[Deployment]
) -> HttpResponse | None:
    """Django's "Delete selected" action, refused (back to the list, nothing deleted) while one of
    the deployments is meant to run."""
    try:
        running = queryset.exclude(desired_state=DesiredState.STOPPED).order_by("pk").first()
        if running is not None:
            raise services.DeploymentRunning(running.pk)
        response: HttpResponse | None = delete_selected(modeladmin, request, queryset)
        return response
    except services.DeploymentRunning as exc:
        modeladmin.message_user(request, str(exc), messages.ERROR)
        return None
