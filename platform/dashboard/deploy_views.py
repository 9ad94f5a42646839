"""The model page's admin actions: deploy the model, stop, start and delete its deployments, delete
the model. Each calls the service (or serializer) the REST API uses, so that its rules hold here
too; a refusal re-renders the model page with the reason (400/409) and changes nothing, a success
redirects back to the page with a notice.
"""

from __future__ import annotations

from deployments import services
from deployments.models import Deployment, DesiredState
from django.db import transaction
from django.db.models import ProtectedError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST
from registry.models import ServedModel
from rest_framework.exceptions import ValidationError

from core.api.errors import still_used
from dashboard import deploy_forms
from dashboard.views import admin_required, model_page


def _back(request: HttpRequest, model_pk: int, notice: str) -> HttpResponse:
    request.session["dashboard_notice"] = notice
    return HttpResponseRedirect(reverse("dashboard:model-detail", args=[model_pk]))


def _refused(request: HttpRequest, model: ServedModel, refusal: str, status: int) -> HttpResponse:
    return model_page(request, model, {"refusal": refusal}, status=status)


@require_POST
@admin_required
def deploy(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(ServedModel, pk=pk)
    serializer, errors = deploy_forms.deploy_serializer(request.POST, model)
    if serializer is not None and not errors:
        try:
            deployment = serializer.save()
        except ValidationError as exc:  # placement: create_deployment's PlacementError
            errors = deploy_forms.shown_errors(exc.detail)
        else:
            return _back(request, model.pk, f"Deployment {deployment.pk} created on {deployment.host.name}.")
    values = {name: request.POST.get(name, "") for name in deploy_forms.DEPLOY_FIELDS}
    extra = {**deploy_forms.deploy_context(values, errors), "deploy_failed": True}
    return model_page(request, model, extra, status=400)


def _set_state(request: HttpRequest, pk: int, state: DesiredState, verb: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment.objects.select_related("model"), pk=pk)
    try:
        services.update_deployment(deployment, desired_state=state)
    except services.PlacementError as exc:  # a Start whose devices another deployment took (the API: 400)
        return _refused(request, deployment.model, f"Deployment {pk} not {verb}: {exc}", 400)
    except Deployment.DoesNotExist:  # deleted by another request since it was read
        raise Http404("No such deployment.") from None
    return _back(request, deployment.model_id, f"Deployment {pk} {verb}.")


@require_POST
@admin_required
def deployment_stop(request: HttpRequest, pk: int) -> HttpResponse:
    return _set_state(request, pk, DesiredState.STOPPED, "stopped")


@require_POST
@admin_required
def deployment_start(request: HttpRequest, pk: int) -> HttpResponse:
    return _set_state(request, pk, DesiredState.RUNNING, "started")


@require_POST
@admin_required
def deployment_delete(request: HttpRequest, pk: int) -> HttpResponse:
    deployment = get_object_or_404(Deployment.objects.select_related("model"), pk=pk)
    try:
        services.delete_stopped_deployment(deployment)
    except services.DeploymentRunning as exc:
        return _refused(request, deployment.model, str(exc), 409)
    except Deployment.DoesNotExist:  # deleted by another request since it was read
        raise Http404("No such deployment.") from None
    return _back(request, deployment.model_id, f"Deployment {pk} deleted.")


@require_POST
@admin_required
def model_delete(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(ServedModel, pk=pk)
    try:
        with transaction.atomic():
            model.delete()
    except ProtectedError as exc:  # deployments still use it: the API's 409, with its message
        return _refused(request, model, still_used(exc), 409)
    request.session["dashboard_notice"] = f"Model {model.name} deleted."
    return HttpResponseRedirect(reverse("dashboard:models"))
