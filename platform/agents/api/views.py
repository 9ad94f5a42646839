"""Chart endpoints: a host's device telemetry and a deployment's engine metrics since an instant."""

from __future__ import annotations

from deployments.models import Deployment
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from inventory.models import Device, Host
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import history
from agents.api.serializers import ReplicaSerializer, SeriesQuerySerializer
from agents.models import Replica

SERIES_PARAMETERS = [
    OpenApiParameter("since", str, description="ISO 8601 instant or epoch seconds; default 5 minutes ago"),
    OpenApiParameter("resolution", str, enum=list(history.RESOLUTIONS), description="default auto"),
]


def _query(request: Request) -> tuple[history.Resolution, SeriesQuerySerializer]:
    query = SeriesQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    data = query.validated_data
    return history.choose_resolution(data["resolution"], data["since"], data["now"]), query


class HostTelemetryView(APIView):
    """``GET /api/v1/hosts/<id>/telemetry/``: every device's samples since ``since``."""

    @extend_schema(parameters=SERIES_PARAMETERS, responses={200: dict})
    def get(self, request: Request, pk: int) -> Response:
        host = get_object_or_404(Host, pk=pk)
        resolution, query = _query(request)
        since = query.validated_data["since"]
        devices = list(Device.objects.filter(host=host).order_by("index"))
        series = history.device_series([d.pk for d in devices], since, resolution)
        return Response(
            {
                "host": host.pk,
                "name": host.name,
                "status": host.status,
                "simulated": host.simulated,
                "since": since,
                "resolution": resolution,
                "devices": [
                    {"id": d.pk, "index": d.index, "name": d.name, "kind": d.kind, "samples": series[d.pk]}
                    for d in devices
                ],
            }
        )


class DeploymentMetricsView(APIView):
    """``GET /api/v1/deployments/<id>/metrics/``: the engine's metrics since ``since`` and its replica."""

    @extend_schema(parameters=SERIES_PARAMETERS, responses={200: dict})
    def get(self, request: Request, pk: int) -> Response:
        deployment = get_object_or_404(Deployment, pk=pk)
        resolution, query = _query(request)
        since = query.validated_data["since"]
        replica = Replica.objects.filter(deployment=deployment).first()
        return Response(
            {
                "deployment": deployment.pk,
                "observed_state": deployment.observed_state,
                "replica": None if replica is None else ReplicaSerializer(replica).data,
                "since": since,
                "resolution": resolution,
                "samples": history.engine_series(deployment.pk, since, resolution),
            }
        )
