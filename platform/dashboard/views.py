"""Dashboard pages. Thin: authorise, read or validate through the owning app, render.

Every page needs a signed-in user with a role; every change needs the admin role and is refused
with 403 otherwise, whatever the page showed (templates hide admin actions from viewers too), but a
user's changes to their own API keys (keys.py).
Read-only pages answer GET and HEAD only (405 otherwise), so that no write method is served there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from accounts.roles import is_admin, role_of
from deployments.models import Deployment
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe
from django.views.defaults import permission_denied
from gateway import services as gateway_services
from jobs import services as jobs_services
from jobs.api.serializers import describe_kinds
from jobs.models import Job
from jobs.registry import JobRefused
from planning.applying import PlanConflict, PlanNotApplicable, apply_plan
from planning.applying import preview as plan_preview
from planning.models import PlacementPlan
from registry.models import ServedModel
from rest_framework.exceptions import ValidationError

from core.unavailable import RETRY_AFTER_S, BrokerUnavailable
from dashboard import deploy_forms, forms, job_pages, snapshots
from dashboard.assets import PLOTLY_VERSION

View = Callable[..., HttpResponse]


def forbidden(request: HttpRequest, reason: str) -> HttpResponse:
    """Django's 403 page saying ``reason``, returned rather than raised: a raised PermissionDenied
    is logged with its traceback (django.request, WARNING), some 40 lines for each refused click of
    a viewer; an answered 403 is logged in one line ("Forbidden: /models/new/")."""
    return permission_denied(request, PermissionDenied(reason))


def role_required(view: View) -> View:
    """Signed in (else the login page) and holding a platform role (else 403)."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if role_of(request.user) is None:
            return forbidden(request, "Your account has no platform role.")
        return view(request, *args, **kwargs)

    return wrapped


def admin_required(view: View) -> View:
    """Like `role_required`, and the admin role (else 403)."""

    @role_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_admin(request.user):
            return forbidden(request, "This action needs the admin role.")
        return view(request, *args, **kwargs)

    return wrapped


def _page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    context.setdefault("is_admin", is_admin(request.user))
    context.setdefault("plotly_version", PLOTLY_VERSION)
    return render(request, f"dashboard/{template}", context, status=status)


@require_safe
@role_required
def overview(request: HttpRequest) -> HttpResponse:
    snap = snapshots.overview()
    return _page(request, "overview.html", {"snapshot": snap, "pairings": snapshots.pairings(snap)})


@require_safe
@role_required
def model_list(request: HttpRequest) -> HttpResponse:
    notice = request.session.pop("dashboard_notice", None)  # a model deleted from its page
    return _page(request, "models.html", {"models": ServedModel.objects.order_by("name"), "notice": notice})


@require_safe
@role_required
def model_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return model_page(request, get_object_or_404(ServedModel, pk=pk))


def model_page(
    request: HttpRequest, model: ServedModel, extra: dict[str, Any] | None = None, status: int = 200
) -> HttpResponse:
    """The model's page; ``extra`` carries what a refused action on it (deploy_views) shows:
    ``refusal``, or the Deploy form's values and errors."""
    points = snapshots.model_history(model)
    deployments = Deployment.objects.filter(model=model).select_related("host").order_by("pk")
    flat = [p for series in points.values() for p in series]
    context = {
        "model": model,
        "deployments": deployments,
        "history": points,
        "attainment": snapshots.attainment(model, flat),
        "attainment_span": snapshots.span_label(snapshots.ATTAINMENT_WINDOW),
        "slo": {"ttft_ms": model.slo_ttft_p99_ms, "tbt_ms": model.slo_tbt_p99_ms},
        "gateway": _gateway_latency_ms(model),
        "notice": request.session.pop("dashboard_notice", None),
    }
    if is_admin(request.user):
        context.update(deploy_forms.deploy_context())
    context.update(extra or {})
    return _page(request, "model_detail.html", context, status=status)


GATEWAY_WINDOW = timedelta(minutes=10)


def _gateway_latency_ms(model: ServedModel) -> dict[str, Any]:
    """What users saw through the /v1 gateway over GATEWAY_WINDOW, in ms (None: no sample). The
    engine's charts start at the engine; these include its front end and the gateway."""
    summary = gateway_services.latency_summary(model, GATEWAY_WINDOW)
    keys = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "tbt_max_p99_s")
    out: dict[str, Any] = {k.removesuffix("_s"): _ms(summary[k]) for k in keys}
    for count in ("requests", "failed", "ttft_requests"):  # all taken, as the usage API counts them
        out[count] = summary[count]
    out["span"] = snapshots.span_label(GATEWAY_WINDOW)
    return out


def _ms(seconds: Any) -> str | None:
    return None if seconds is None else f"{float(seconds) * 1000:.1f}"


@admin_required
def model_create(request: HttpRequest) -> HttpResponse:
    return _model_form(request, None)


@admin_required
def model_edit(request: HttpRequest, pk: int) -> HttpResponse:
    return _model_form(request, get_object_or_404(ServedModel, pk=pk))


def _model_form(request: HttpRequest, instance: ServedModel | None) -> HttpResponse:
    values: dict[str, Any] = {}
    if instance is not None:
        values = {name: getattr(instance, name) for name in forms.MODEL_FIELDS}
        values["engine_options"] = json.dumps(instance.engine_options)
    errors: forms.Errors = {}
    if request.method == "POST":
        serializer, errors = forms.model_serializer(request.POST, instance)
        if serializer is not None and not errors:
            try:
                model = serializer.save()
            except ValidationError as exc:  # a concurrent request took the name since is_valid()
                errors = forms.field_errors(exc.detail)
            except ServedModel.DoesNotExist:  # an edit of a model deleted since it was read
                raise Http404("No such model.") from None
            else:
                return HttpResponseRedirect(reverse("dashboard:model-detail", args=[model.pk]))
        values = {name: request.POST.get(name, "") for name in forms.MODEL_FIELDS}
    context = {"instance": instance, "values": values, "errors": errors, "dtypes": _dtypes()}
    return _page(request, "model_form.html", context, status=400 if errors else 200)


def _dtypes() -> list[str]:
    from registry.models import DType

    return [str(v) for v in DType.values]


@require_safe
@role_required
def job_list(request: HttpRequest) -> HttpResponse:
    """The newest jobs, live; ``?page=N`` older ones (job_pages). A bad page is refused on the page."""
    context: dict[str, Any] = {"kinds": describe_kinds(), "errors": {}, "values": {}}
    try:
        context.update(job_pages.jobs_page(request.GET.get("page")))
    except job_pages.PageRefused as exc:
        context.update(refusal=str(exc), pages=exc.pages)
        return _page(request, "jobs.html", context, status=exc.status)
    return _page(request, "jobs.html", context)


@require_POST
@admin_required
def job_start(request: HttpRequest) -> HttpResponse:
    serializer, errors = forms.job_serializer(request.POST)
    if serializer is None or errors:
        return _refused_job_form(request, errors)
    data = serializer.validated_data
    try:
        job = jobs_services.create_job(data["kind"], data["params"], request.user)
    except JobRefused as exc:  # e.g. another profile job of the model was stored since validation
        return _refused_job_form(request, forms.field_errors(exc.detail))
    except BrokerUnavailable as exc:  # nothing was stored: the same form, to send again later
        response = _refused_job_form(request, {"form": [f"{exc} Retry later."]}, status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return HttpResponseRedirect(reverse("dashboard:job-detail", args=[job.pk]))


def _refused_job_form(request: HttpRequest, errors: forms.Errors, status: int = 400) -> HttpResponse:
    context = {
        **job_pages.jobs_page(None),
        "kinds": describe_kinds(),
        "errors": errors,
        "values": {"kind": request.POST.get("kind", ""), "params": request.POST.get("params", "")},
    }
    return _page(request, "jobs.html", context, status=status)


@require_safe
@role_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _job_page(request, get_object_or_404(Job, pk=pk))


def _job_page(request: HttpRequest, job: Job, refusal: str = "", status: int = 200) -> HttpResponse:
    """The job's page; ``refusal`` says why an action on it (Apply) changed nothing."""
    plan = PlacementPlan.objects.filter(job=job).first()
    grid = _plan_grid(plan)
    preview = plan_preview(plan) if plan is not None else None
    context = {
        "job": job,
        "plan": plan,
        # Why an Apply would be refused now (a stale plan): then the page offers none.
        "stale": preview.refusal if preview is not None else None,
        # An Apply would change no deployment (no moves, or in effect already): none is offered.
        "changes_nothing": plan is not None
        and plan.applied_at is None
        and preview is not None
        and preview.refusal is None
        and not preview.changes,
        "grid": grid,
        "gpu_columns": range(max((len(row["cells"]) for row in grid), default=0)),
        "notice": request.session.pop("dashboard_notice", None),
        "refusal": refusal,
    }
    return _page(request, "job_detail.html", context, status=status)


def _plan_grid(plan: PlacementPlan | None) -> list[dict[str, Any]]:
    """Servers with one cell per GPU: the model planned there, and whether that is a change."""
    if plan is None:
        return []
    moved = {m["model"] for m in plan.moves}
    rows = []
    for server in plan.plan.get("servers", []):
        cells: list[dict[str, Any]] = [{"model": None, "changed": False} for _ in range(server["num_gpus"])]
        for a in plan.plan.get("assignments", []):
            if a["server"] == server["name"]:
                for gpu in a["gpus"]:
                    cells[gpu] = {"model": a["model"], "changed": a["model"] in moved}
        rows.append({"server": server["name"], "cells": cells})
    return rows


@require_POST
@admin_required
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=pk)
    try:
        jobs_services.cancel_job(job)
    except jobs_services.JobNotActive as exc:  # it finished since the page was loaded
        return _job_page(request, job, f"Not cancelled: {exc}.", status=409)
    request.session["dashboard_notice"] = "Cancelled."
    return HttpResponseRedirect(reverse("dashboard:job-detail", args=[job.pk]))


@require_POST
@admin_required
def plan_apply(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=pk)
    try:
        outcome = apply_plan(job, request.user)
    except PlanNotApplicable as exc:
        return _job_page(request, job, f"Not applied: {exc}.", status=404)
    except PlanConflict as exc:
        return _job_page(request, job, f"Not applied: {exc}", status=409)
    request.session["dashboard_notice"] = outcome.detail
    return HttpResponseRedirect(reverse("dashboard:job-detail", args=[job.pk]))


@require_safe
@role_required
def deployment_logs(request: HttpRequest, pk: int) -> HttpResponse:
    deployment = get_object_or_404(Deployment.objects.select_related("model", "host"), pk=pk)
    return _page(request, "logs.html", {"deployment": deployment})
