"""``profile``: a served model's max request rate under its SLO, role and memory figures.

The work is in planning.profiling; this module declares the parameters and registers the kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from planning.profiling import context_of, preset_gpu_of, preset_model_of, run_profile
from registry.models import ServedModel
from rest_framework import serializers

from core.serializers import FloatField, IntegerField
from jobs.kinds.params import MAX_BURST_LEVEL, StrictParams
from jobs.models import ACTIVE_STATUSES, Job
from jobs.registry import JobContext, JobKind, JobRefused, register
from serving.costmodel.config import MODEL_CONFIGS
from serving.costmodel.gpus import GPU_SPECS
from serving.profiler import ProfilerConfig, ProfilingError
from serving.profiler.config import check_distinct_burst_levels

# Upper bounds that keep one probe's workload in memory and its run in minutes: a burst replays
# about rate x level x burst_duration_s requests (serving/profiler WorkloadSpec.burst_requests).
MAX_RATE = 100_000.0
MAX_BURST_DURATION_S = 600.0
RATES = ("min_rate", "initial_rate", "max_rate")
PROFILER_DEFAULTS = ProfilerConfig()


class WorkloadParams(StrictParams):
    """serving.profiler.WorkloadSpec: the workload replayed at each probed rate."""

    kind = serializers.ChoiceField(choices=["poisson", "gamma"], default="poisson")
    dataset = serializers.CharField(default="sharegpt", help_text="length distribution (serving/workload)")
    num_requests = IntegerField(min_value=1, max_value=100_000, default=200)
    seed = IntegerField(min_value=0, max_value=2**32 - 1, default=0)
    burstiness = FloatField(
        min_value=0.01, max_value=1000.0, default=0.5, help_text="gamma shape (kind=gamma)"
    )
    max_context = IntegerField(
        min_value=2, required=False, help_text="cap on prompt + output tokens (default: the model's)"
    )
    burst_duration_s = FloatField(min_value=0.1, max_value=MAX_BURST_DURATION_S, default=10.0)

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
    deployment = IntegerField(
        required=False, help_text="engine: the deployment to probe (default: the model's first running one)"
    )
    probe_timeout_s = FloatField(min_value=1.0, max_value=3600.0, default=600.0)
    workload = WorkloadParams(required=False)
    initial_rate = FloatField(
        min_value=1e-4, max_value=MAX_RATE, required=False, help_text="first rate probed (req/s)"
    )
    min_rate = FloatField(min_value=1e-4, max_value=MAX_RATE, required=False)
    max_rate = FloatField(min_value=1e-4, max_value=MAX_RATE, required=False)
    rel_tol = FloatField(min_value=1e-4, max_value=0.5, required=False)
    max_probes = IntegerField(min_value=2, max_value=200, required=False)
    burst_levels = serializers.ListField(
        child=FloatField(min_value=1.0, max_value=MAX_BURST_LEVEL),
        required=False,
        max_length=10,
        allow_empty=False,
    )

    def validate_model(self, value: str) -> str:
        if not ServedModel.objects.filter(name=value).exists():
            raise serializers.ValidationError(f"No served model named {value!r}.")
        return value

    def validate_preset_model(self, value: str) -> str:
        return _one_of(value, MODEL_CONFIGS, "cost-model preset model")

    def validate_preset_gpu(self, value: str) -> str:
        return _one_of(value, GPU_SPECS, "cost-model preset GPU")

    def validate_burst_levels(self, value: list[float]) -> list[float]:
        # A stored profile names each level's swap need "4x": two levels named alike would
        # overwrite each other, which the worker's ProfilerConfig refuses once the job runs.
        try:
            check_distinct_burst_levels(value)
        except ValueError as exc:
            raise serializers.ValidationError(_sentence(str(exc))) from None
        return value

    def validate_policy(self, value: str) -> str:
        from serving.policies import available_policies

        return _one_of(value, available_policies(), "scheduling policy")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("backend") != "engine" and "deployment" in attrs:
            raise serializers.ValidationError(
                {"deployment": ["Only the engine backend probes a deployment."]}
            )
        # The profiler's defaults fill the rates not given: {"max_rate": 0.5} is below its initial 1.0.
        rates = {name: attrs.get(name, getattr(PROFILER_DEFAULTS, name)) for name in RATES}
        if list(rates.values()) != sorted(rates.values()):
            field = next(name for name in ("initial_rate", *RATES) if name in attrs)
            shown = ", ".join(f"{name}={value:g}" for name, value in rates.items())
            raise serializers.ValidationError(
                {field: [f"Need min_rate <= initial_rate <= max_rate (with the defaults: {shown})."]}
            )
        if "workload" in attrs:
            attrs["workload"] = dict(attrs["workload"])
        errors = what_the_worker_would_refuse(attrs)
        busy = busy_error(attrs["model"])
        if busy is not None:
            errors.setdefault("model", []).append(busy)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def what_the_worker_would_refuse(attrs: dict[str, Any]) -> dict[str, list[str]]:
    """Field errors for what the worker needs and cannot find: a model context that fits a
    request, the deployment an engine profile probes, the cost-model presets a simulator profile
    uses. The worker runs the same checks (planning.profiling.context_of,
    planning.engine_probe.running_deployment, planning.profiling.preset_*_of) when the job runs,
    since deployments and models may change while it is queued."""
    from planning.engine_probe import running_deployment  # as run_profile imports it

    model = ServedModel.objects.filter(name=attrs["model"]).first()
    if model is None:  # deleted since validate_model
        return {"model": [f"No served model named {attrs['model']!r}."]}
    errors: dict[str, list[str]] = {}
    try:
        context_of(model)  # both backends: no request fits in a shorter context
    except ProfilingError as exc:
        errors["model"] = [_sentence(str(exc))]
    if attrs.get("backend") == "engine":
        # With no deployment named, the backend is what the client chose and could change.
        field = "deployment" if "deployment" in attrs else "backend"
        try:
            running_deployment(model, attrs.get("deployment"))
        except ProfilingError as exc:
            errors[field] = [_sentence(str(exc))]
        return errors
    for field, preset_of in (("preset_model", preset_model_of), ("preset_gpu", preset_gpu_of)):
        try:
            preset_of(model, attrs)
        except ProfilingError as exc:
            errors[field] = [_sentence(str(exc))]
    return errors


def _sentence(message: str) -> str:
    return f"{message[:1].upper()}{message[1:]}."


def _one_of(value: str, known: Iterable[str], what: str) -> str:
    names = sorted(known)
    if value not in names:
        raise serializers.ValidationError(f"Unknown {what} {value!r}; known: {', '.join(names)}.")
    return value


def active_profile_job(model: str) -> tuple[int, str] | None:
    """(id, status) of a queued or running profile job of `model`, if there is one."""
    return (
        Job.objects.filter(kind="profile", status__in=ACTIVE_STATUSES, params__model=model)
        .order_by("pk")
        .values_list("pk", "status")
        .first()
    )


def busy_error(model: str) -> str | None:
    """Why a profile job of `model` cannot start now: another one is queued or running.

    Two profiles of one model race for its stored profile, and two engine probes of one deployment
    load it at once: each would measure the other's requests too."""
    busy = active_profile_job(model)
    if busy is None:
        return None
    job_id, status = busy
    return f"Profile job {job_id} of this model is already {status}; wait for it or cancel it."


def admit(params: dict[str, Any]) -> None:
    """Refuse the job if another profile job of its model became active after `validate` checked.

    Runs in the transaction that stores the job (jobs.services.create_job). The model's row lock
    (PostgreSQL; SQLite's immediate transactions serialise writers anyway) makes concurrent posts
    for one model wait for each other's commit, so the second sees the first's job."""
    name = params["model"]
    if not list(ServedModel.objects.select_for_update(no_key=True).filter(name=name).values_list("pk")):
        raise JobRefused({"model": [f"No served model named {name!r}."]})
    busy = busy_error(name)
    if busy is not None:
        raise JobRefused({"model": [busy]})


def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return run_profile(params, ctx)


PROFILE = register(
    JobKind(
        name="profile",
        params_serializer=ProfileParams,
        run=run,
        admit=admit,
        expected_errors=(ProfilingError,),
        description="Find a model's max request rate under its SLO (simulator or real engine), its "
        "producer/consumer role and memory figures; stores the curve and the model's profile.",
    )
)
