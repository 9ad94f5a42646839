from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.schema import conflict
from core.serializers import StrictSerializer
from jobs import services
from jobs.api.serializers import JobKindSerializer, JobSerializer, describe_kinds
from jobs.models import Job, JobStatus
from jobs.registry import kind_names


class JobViewSet(
    mixins.ListModelMixin, mixins.CreateModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Jobs: admins start (``POST``) and cancel them; everyone with a role reads them.

    ``?status=`` and ``?kind=`` filter the list (newest first).
    """

    serializer_class = JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        jobs = Job.objects.select_related("created_by").order_by("-id")
        if self.action != "list":
            return jobs
        known = {"status": sorted(JobStatus.values), "kind": kind_names()}
        errors = {}
        for name, choices in known.items():
            value = self.request.query_params.get(name)
            if value and value not in choices:
                errors[name] = [f"{value!r} is not one of {', '.join(choices)}."]
            elif value:
                jobs = jobs.filter(**{name: value})
        if errors:  # a typo in a filter would otherwise read as "no such jobs"
            raise ValidationError(errors)
        return jobs

    @extend_schema(
        parameters=[OpenApiParameter("status", str), OpenApiParameter("kind", str)],
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(
        responses={
            201: JobSerializer,
            # core.api.errors answers BrokerUnavailable (jobs.services.create_job) so.
            503: OpenApiResponse(
                inline_serializer("BrokerUnavailable", {"detail": serializers.CharField()}),
                "The job broker did not take the job: no job was stored; send it again after "
                "Retry-After seconds.",
            ),
        },
        parameters=[
            OpenApiParameter(
                "Retry-After",
                int,
                OpenApiParameter.HEADER,
                description="Seconds to wait before sending the job again.",
                response=[503],
            )
        ],
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        serializer.instance = services.create_job(data["kind"], data["params"], self.request.user)

    @extend_schema(responses=JobKindSerializer(many=True))
    @action(detail=False, methods=["get"], pagination_class=None)
    def kinds(self, request: Request) -> Response:
        """The registered job kinds with their parameters (name, type, default, bounds)."""
        return Response(JobKindSerializer(describe_kinds(), many=True).data)

    @extend_schema(
        request=None,
        responses={
            200: JobSerializer,
            400: None,
            409: conflict("The job has already finished (succeeded, failed or cancelled)."),
        },
        description="Cancel a queued or running job (admins only). It takes no body fields: any (a "
        "typo of something it does not take) is a 400 naming it, nothing cancelled.",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        # An empty body (or {}); a field is no option it has, so it is refused, not ignored.
        StrictSerializer(data=request.data).is_valid(raise_exception=True)
        try:
            job = services.cancel_job(self.get_object())
        except services.JobNotActive as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(job).data)
