"""``profile``: a served model's max request rate under its SLO, role and memory figures.

The work is in planning.profiling; this module declares the parameters and registers the kind.
"""

from __future__ import annotations

from typing import Any

from planning.profiling import run_profile
from registry.models import ServedModel
from rest_framework import serializers

from jobs.kinds.params import StrictParams
from jobs.registry import JobContext, JobKind, register


class WorkloadParams(StrictParams):
    """serving.profiler.WorkloadSpec: the workload replayed at each probed rate."""

    kind = serializers.ChoiceField(choices=["poisson", "gamma"], default="poisson")
    dataset = serializers.CharField(default="sharegpt", help_text="length distribution (serving/workload)")
    num_requests = serializers.IntegerField(min_value=1, max_value=100_000, default=200)
    seed = serializers.IntegerField(default=0)
    burstiness = serializers.FloatField(min_value=0.01, default=0.5, help_text="gamma shape (kind=gamma)")
    max_context = serializers.IntegerField(
        min_value=2, required=False, help_text="cap on prompt + output tokens (default: the model's)"
    )
    burst_duration_s = serializers.FloatField(min_value=0.1, default=10.0)

    def validate_dataset(self, value: str) -> str:
        from serving.workload import get_length_dist

        try:
            get_length_dist(value)
        except (KeyError, ValueError) as exc:
            raise serializers.ValidationError(str(exc).strip("'\"")) from None
        return value


class ProfileParams(StrictParams):
    model = serializers.SlugField(help_text="the served model's name")
    backend = serializers.ChoiceField(
        choices=["simulator", "engine"],
        default="simulator",
        help_text="simulator: a cost-model preset; engine: a running deployment, through its agent",
    )
    preset_model = serializers.CharField(required=False, help_text="simulator: cost-model preset model")
    preset_gpu = serializers.CharField(required=False, help_text="simulator: cost-model preset GPU")
    policy = serializers.CharField(required=False, help_text="simulator: scheduling policy (default fcfs)")
    deployment = serializers.IntegerField(
        required=False, help_text="engine: the deployment to probe (default: the model's first running one)"
    )
    probe_timeout_s = serializers.FloatField(min_value=1.0, max_value=3600.0, default=600.0)
    workload = WorkloadParams(required=False)
    initial_rate = serializers.FloatField(
        min_value=1e-4, required=False, help_text="first rate probed (req/s)"
    )
    min_rate = serializers.FloatField(min_value=1e-4, required=False)
    max_rate = serializers.FloatField(min_value=1e-4, required=False)
    rel_tol = serializers.FloatField(min_value=1e-4, max_value=0.5, required=False)
    max_probes = serializers.IntegerField(min_value=2, max_value=200, required=False)
    burst_levels = serializers.ListField(
        child=serializers.FloatField(min_value=1.0), required=False, max_length=10, allow_empty=False
    )

    def validate_model(self, value: str) -> str:
        if not ServedModel.objects.filter(name=value).exists():
            raise serializers.ValidationError(f"No served model named {value!r}.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("backend") != "engine" and "deployment" in attrs:
            raise serializers.ValidationError(
                {"deployment": ["Only the engine backend probes a deployment."]}
            )
        lo, init, hi = attrs.get("min_rate"), attrs.get("initial_rate"), attrs.get("max_rate")
        known = [x for x in (lo, init, hi) if x is not None]
        if known != sorted(known):
            raise serializers.ValidationError(
                {"initial_rate": ["Need min_rate <= initial_rate <= max_rate."]}
            )
        if "workload" in attrs:
            attrs["workload"] = dict(attrs["workload"])
        return attrs


def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return run_profile(params, ctx)


PROFILE = register(
    JobKind(
        name="profile",
        params_serializer=ProfileParams,
        run=run,
        description="Find a model's max request rate under its SLO (simulator or real engine), its "
        "producer/consumer role and memory figures; stores the curve and the model's profile.",
    )
)
