"""Read endpoints for the dashboard: a model's gateway latencies (SLO charts) and key usage."""

from __future__ import annotations

from datetime import timedelta

from accounts.services import api_keys_visible_to
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from registry.models import ServedModel
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.serializers import FloatField, IntegerField
from gateway.models import RequestSample, Usage
from gateway.services import latency_summary

MAX_POINTS = 2000


class WindowSerializer(serializers.Serializer[dict[str, float]]):
    window_s = FloatField(min_value=1, max_value=7 * 86400, default=600)


@extend_schema_serializer(deprecate_fields=["tbt_p50_s", "tbt_p99_s"])
class LatencySummarySerializer(serializers.Serializer[dict[str, object]]):
    """Percentiles (linearly interpolated) over the window's requests; null without samples. The
    gateway keeps each request's mean and largest token gap, not every gap (gateway.services
    ``latency_summary``)."""

    requests = IntegerField(
        help_text="requests an engine took in the window, as /api/v1/gateway/usage/ counts them: "
        "those it refused or cut off (failed) included"
    )
    failed = IntegerField(
        help_text="of requests, those that ended in the engine's error (refused or cut off)"
    )
    ttft_requests = IntegerField(
        help_text="of requests, those that got a first token: what the TTFT percentiles are over"
    )
    ttft_p50_s = FloatField(allow_null=True, help_text="P50 time to first token")
    ttft_p99_s = FloatField(allow_null=True, help_text="P99 time to first token; see ttft_slo_s")
    tpot_p50_s = FloatField(
        allow_null=True,
        help_text="P50 over streamed requests of their mean token gap (time per output token)",
    )
    tpot_p99_s = FloatField(
        allow_null=True,
        help_text="P99 over streamed requests of their mean token gap (time per output token); "
        "not comparable with tbt_slo_s",
    )
    tbt_max_p99_s = FloatField(
        allow_null=True,
        help_text="P99 over streamed requests of their largest token gap (which bounds all of that "
        "request's gaps): the figure to compare with tbt_slo_s; usually above, but not a bound on, "
        "the P99 over all gaps, which the gateway does not keep",
    )
    tbt_p50_s = FloatField(
        allow_null=True, help_text="Deprecated: the same value as tpot_p50_s (a mean gap per request)"
    )
    tbt_p99_s = FloatField(
        allow_null=True,
        help_text="Deprecated: the same value as tpot_p99_s (a mean gap per request, which it always "
        "was), not a time-between-tokens P99; compare tbt_max_p99_s with tbt_slo_s",
    )
    ttft_slo_s = FloatField(help_text="the model's P99 TTFT target (slo_ttft_p99_ms / 1000)")
    tbt_slo_s = FloatField(help_text="the model's P99 time-between-tokens target (slo_tbt_p99_ms / 1000)")


class RequestPointSerializer(serializers.Serializer[dict[str, object]]):
    ts = serializers.DateTimeField()
    deployment_id = IntegerField(allow_null=True)
    outcome = serializers.CharField()
    stream = serializers.BooleanField()
    ttft_s = FloatField(allow_null=True)
    tbt_mean_s = FloatField(
        allow_null=True, help_text="mean gap between the streamed token chunks (time per output token)"
    )
    tbt_max_s = FloatField(allow_null=True, help_text="largest gap between the streamed token chunks")


class ModelLatencySerializer(serializers.Serializer[dict[str, object]]):
    model = serializers.CharField()
    summary = LatencySummarySerializer()
    requests = RequestPointSerializer(many=True)


class UsageRowSerializer(serializers.Serializer[Usage]):
    key = IntegerField(source="key_id")
    key_name = serializers.CharField(source="key.name")
    model = serializers.CharField(source="model_name", help_text="the model's name when it was used")
    period_start = serializers.DateTimeField()
    requests = IntegerField(help_text="requests an engine took: those it refused or cut off included")
    prompt_tokens = IntegerField()
    completion_tokens = IntegerField()


class ModelLatencyView(APIView):
    """``GET /api/v1/gateway/latency/<model>/``: TTFT and token gaps per request through the
    gateway (the newest ``MAX_POINTS``), with percentiles over ``window_s`` seconds and the model's
    SLO targets (``LatencySummarySerializer``)."""

    @extend_schema(
        parameters=[OpenApiParameter("window_s", float, description="default 600")],
        responses=ModelLatencySerializer,
    )
    def get(self, request: Request, name: str) -> Response:
        model = get_object_or_404(ServedModel, name=name)
        query = WindowSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        window = timedelta(seconds=query.validated_data["window_s"])
        points = RequestSample.objects.filter(model=model, ts__gte=timezone.now() - window).order_by(
            "-ts", "-id"
        )
        rows = points.values("ts", "deployment_id", "outcome", "stream", "ttft_s", "tbt_mean_s", "tbt_max_s")
        return Response(
            {
                "model": model.name,
                "summary": latency_summary(model, window),
                "requests": list(reversed(rows[:MAX_POINTS])),
            }
        )


class UsageView(generics.ListAPIView):
    """``GET /api/v1/gateway/usage/``: per key, model and UTC day (own keys; admins see all), newest
    day first; paginated like every list (``?page=``, ``?page_size=`` up to 500)."""

    serializer_class = UsageRowSerializer

    def get_queryset(self) -> QuerySet[Usage]:
        keys = api_keys_visible_to(self.request.user)
        # "id" last: a total order, so that pages neither repeat nor skip a row.
        return (
            Usage.objects.filter(key__in=keys).select_related("key").order_by("-period_start", "key_id", "id")
        )
