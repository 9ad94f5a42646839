from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from jobs.models import Job
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from planning import services
from planning.api.serializers import ApplyResultSerializer, ModelProfileSerializer, PlacementPlanSerializer
from planning.models import ModelProfile, PlacementPlan


class ModelProfileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Each model's current profile (written by `profile` jobs), by model name."""

    queryset = ModelProfile.objects.select_related("model").order_by("model__name")
    serializer_class = ModelProfileSerializer
    lookup_field = "model__name"
    lookup_url_kwarg = "model"


class PlacementPlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Plans of succeeded `place` jobs, by job id; admins apply them to the deployments."""

    serializer_class = PlacementPlanSerializer
    lookup_field = "job_id"
    lookup_url_kwarg = "job"

    def get_queryset(self) -> QuerySet[PlacementPlan]:
        return PlacementPlan.objects.select_related("job", "applied_by").order_by("-job_id")

    @extend_schema(
        request=None,
        responses={200: ApplyResultSerializer, 404: None, 409: None},
        description="Apply the plan with the fewest deployment changes (admins only). Applying a plan "
        "that is already in effect changes nothing; a plan computed against deployments that have "
        "changed since is refused with 409.",
    )
    @action(detail=True, methods=["post"])
    def apply(self, request: Request, job: str | None = None) -> Response:
        job_row = Job.objects.filter(pk=job).first() if job and job.isascii() and job.isdigit() else None
        if job_row is None:
            raise NotFound(f"No job {job}.")
        try:
            outcome = services.apply_plan(job_row, request.user)
        except services.PlanNotApplicable as exc:
            raise NotFound(str(exc)) from None
        except services.PlanConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        data = ApplyResultSerializer(
            {"applied": outcome.applied, "moves": outcome.moves, "detail": outcome.detail}
        )
        return Response(data.data)
