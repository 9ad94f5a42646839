from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from jobs.models import Job, JobStatus
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from core import ids
from core.api.schema import conflict
from core.serializers import StrictSerializer
from planning import services
from planning.api.serializers import ApplyResultSerializer, ModelProfileSerializer, PlacementPlanSerializer
from planning.models import ModelProfile, PlacementPlan


class ModelProfileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Each model's current profile (written by `profile` jobs), by model name."""

    queryset = ModelProfile.objects.select_related("model").order_by("model__name")
    serializer_class = ModelProfileSerializer
    lookup_field = "model__name"
    lookup_url_kwarg = "model"


JOB_ID = OpenApiParameter("job", int, OpenApiParameter.PATH, description="the place job's id")


@extend_schema_view(retrieve=extend_schema(parameters=[JOB_ID]))
class PlacementPlanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Plans of succeeded `place` jobs, by job id; admins apply them to the deployments."""

    serializer_class = PlacementPlanSerializer
    # Through the job's primary key, not the job_id column: Django answers a pk lookup beyond the
    # column's range (an id >= 2**63) with no rows, as for the other endpoints, while a lookup of
    # the foreign-key column hands the value to the database driver (OverflowError on SQLite).
    lookup_field = "job__pk"
    lookup_url_kwarg = "job"

    def get_queryset(self) -> QuerySet[PlacementPlan]:
        # A plan is stored before its job ends: one whose job was then cancelled (or failed, or lost
        # with its worker) is no plan to apply, and Apply refuses it; it is not listed either.
        return (
            PlacementPlan.objects.select_related("job", "applied_by")
            .filter(job__status=JobStatus.SUCCEEDED)
            .order_by("-job_id")
        )

    @extend_schema(
        parameters=[JOB_ID],
        request=None,
        responses={
            200: ApplyResultSerializer,
            400: None,
            404: None,
            409: conflict("The plan was computed against deployments that have changed since."),
        },
        description="Apply the plan with the fewest deployment changes (admins only). A plan is applied "
        "once: applying it again, or one already in effect, changes nothing (`applied` false; one "
        "already in effect is not marked applied, as it changed nothing); a plan "
        "computed against deployments that have changed since is refused with 409. It takes no body "
        "fields: any (a typo of something it does not take) is a 400 naming it, nothing applied.",
    )
    @action(detail=True, methods=["post"])
    def apply(self, request: Request, job: str | None = None) -> Response:
        # An empty body (or {}); a field is no option it has, so it is refused, not ignored.
        StrictSerializer(data=request.data).is_valid(raise_exception=True)
        pk = ids.parse_pk(job or "")
        job_row = Job.objects.filter(pk=pk).first() if pk is not None else None
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
