"""The `profile` job: a served model's max request rate under its SLO, its role and memory figures.

Backends:
  simulator  serving.profiler.SimulatorProbe with a cost-model preset. The preset's model and GPU
             come from the job's parameters, else the model's ``engine_options`` (``sim_model``,
             ``sim_gpu``), else the model's name (when it names a preset model) and the GPU of the
             model's running deployment (its device name, e.g. "NVIDIA H100 ...").
  engine     a running deployment of the model, probed through its host's agent
             (planning.engine_probe.AgentEngineProbe).
The SLA is the model's SLO (P99 TTFT and P99 TBT). On success the profile becomes the model's
current `ModelProfile` (replacing the previous one) and the job's result holds the whole profile:
the latency-vs-rate curve, the SLA, max_rps, role, lendable bytes and swap needed per burst level.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from deployments.models import Deployment, DesiredState
from django.db import transaction
from jobs.models import Job, JobStatus
from jobs.registry import JobCancelled, JobContext
from registry.models import MIN_CONTEXT_LENGTH, ServedModel

from planning.jobctx import cancel_fn, job_id_of, progress_fn
from planning.models import ModelProfile
from serving.costmodel import get_preset, kv_capacity_tokens
from serving.costmodel.config import MODEL_CONFIGS
from serving.costmodel.gpus import GPU_SPECS
from serving.profiler import (
    LatencySLA,
    Profile,
    ProfilerConfig,
    ProfilingCancelled,
    ProfilingError,
    RateProbe,
    SimulatorProbe,
    WorkloadSpec,
    profile_model,
)
from serving.sim.config import EngineConfig

CONFIG_KEYS = ("initial_rate", "min_rate", "max_rate", "rel_tol", "max_probes", "burst_levels")


def sla_of(model: ServedModel) -> LatencySLA:
    """The model's SLO as the profiler's SLA (ms -> s); ProfilingError if it is not usable."""
    try:
        return LatencySLA(ttft_p99_s=model.slo_ttft_p99_ms / 1000.0, tbt_p99_s=model.slo_tbt_p99_ms / 1000.0)
    except (TypeError, ValueError) as exc:
        raise ProfilingError(f"model {model.name!r} has an unusable SLO: {exc}") from None


def context_of(model: ServedModel) -> int:
    """The model's context length, which every profiled request fits in.
    Checked when the job is posted (jobs.kinds.profile) and again when it runs.

    Raises:
        ProfilingError: below MIN_CONTEXT_LENGTH (a row stored before the model field had that
            minimum): no request of a prompt and an answer fits.
    """
    if model.max_context_length < MIN_CONTEXT_LENGTH:
        raise ProfilingError(
            f"model {model.name!r} has max_context_length={model.max_context_length}, below "
            f"{MIN_CONTEXT_LENGTH} (one prompt and one output token): raise it to profile the model"
        )
    return model.max_context_length


def workload_of(model: ServedModel, params: dict[str, Any]) -> WorkloadSpec:
    """The job's workload; requests never exceed the model's context length."""
    context = context_of(model)
    spec = dict(params.get("workload") or {})
    cap = spec.get("max_context") or context
    spec["max_context"] = min(int(cap), context)
    try:
        return WorkloadSpec(**spec)
    except (TypeError, ValueError) as exc:
        raise ProfilingError(f"bad workload: {exc}") from None


def config_of(params: dict[str, Any]) -> ProfilerConfig:
    kw = {k: params[k] for k in CONFIG_KEYS if params.get(k) is not None}
    if "burst_levels" in kw:
        kw["burst_levels"] = tuple(float(x) for x in kw["burst_levels"])
    try:
        return ProfilerConfig(**kw)
    except ValueError as exc:
        raise ProfilingError(f"bad profiler settings: {exc}") from None


def _deployed_gpu(model: ServedModel) -> str | None:
    """The preset GPU name of the first running deployment's device, if its name contains one."""
    deployment = (
        Deployment.objects.filter(model=model, desired_state=DesiredState.RUNNING).order_by("pk").first()
    )
    if deployment is None:
        return None
    for device in deployment.devices.order_by("index"):
        lowered = device.name.lower()
        for gpu in sorted(GPU_SPECS):
            if gpu in lowered:
                return gpu
    return None


def preset_model_of(model: ServedModel, params: Mapping[str, Any]) -> str:
    """The cost-model preset model a simulator profile of `model` uses (module docstring).
    Checked when the job is posted (jobs.kinds.profile) and again when it runs.

    Raises:
        ProfilingError: the job names none and none can be derived from the model, or the one
            named or derived is not a preset.
    """
    options = model.engine_options or {}
    preset_model = params.get("preset_model") or options.get("sim_model")
    if not preset_model and model.name in MODEL_CONFIGS:
        preset_model = model.name
    if not preset_model:
        raise ProfilingError(
            f"no cost-model preset for model {model.name!r}: pass preset_model (one of "
            f"{', '.join(sorted(MODEL_CONFIGS))}) or set engine_options.sim_model"
        )
    _check_preset(model, params, "preset_model", "sim_model", preset_model, MODEL_CONFIGS)
    return str(preset_model)


def preset_gpu_of(model: ServedModel, params: Mapping[str, Any]) -> str:
    """The cost-model preset GPU a simulator profile of `model` uses (module docstring).
    Checked when the job is posted (jobs.kinds.profile) and again when it runs.

    Raises:
        ProfilingError: the job names none and none can be derived from the model, or the one
            named or derived is not a preset.
    """
    options = model.engine_options or {}
    gpu = params.get("preset_gpu") or options.get("sim_gpu") or _deployed_gpu(model)
    if not gpu:
        raise ProfilingError(
            f"no GPU preset for model {model.name!r}: pass preset_gpu (one of "
            f"{', '.join(sorted(GPU_SPECS))}), set engine_options.sim_gpu, or deploy it on a known GPU"
        )
    _check_preset(model, params, "preset_gpu", "sim_gpu", gpu, GPU_SPECS)
    return str(gpu)


def _check_preset(
    model: ServedModel,
    params: Mapping[str, Any],
    param: str,
    option: str,
    name: Any,
    known: Mapping[str, Any],
) -> None:
    """ProfilingError if `name`, from the job's `param` or else the model's engine_options `option`,
    is not in `known`. The API checks both when they are set (jobs.kinds.profile,
    registry.validators), but a model stored before its engine options were checked by name would
    otherwise fail inside the cost model, in the worker."""
    if isinstance(name, str) and name in known:
        return
    names = ", ".join(sorted(known))
    if params.get(param):
        raise ProfilingError(f"{param} {name!r} is not a cost-model preset; known: {names}")
    raise ProfilingError(
        f"model {model.name!r} has engine_options.{option} {name!r}, not a cost-model preset: "
        f"pass {param} (one of {names}) or change engine_options.{option}"
    )


def simulator_probe(model: ServedModel, params: dict[str, Any], workload: WorkloadSpec) -> RateProbe:
    """A SimulatorProbe for the model (see the module docstring for how the preset is chosen)."""
    options = model.engine_options or {}
    preset_model = preset_model_of(model, params)
    gpu = preset_gpu_of(model, params)
    tp = model.tensor_parallel_size
    block_size = 16
    try:
        cost = get_preset(preset_model, gpu, tp)
        if options.get("kv_cache_bytes"):
            tokens = int(options["kv_cache_bytes"]) // cost.kv_bytes_per_token
        else:
            util = float(options.get("gpu_memory_utilization", 0.9))
            tokens = kv_capacity_tokens(preset_model, gpu, tp, mem_util=util)
        engine = EngineConfig(
            num_kv_blocks=max(1, tokens // block_size),
            block_size=block_size,
            max_num_seqs=int(options.get("max_num_seqs", 256)),
        )
        # the probe runs on the GPU the preset is of (the deployed device's kind, as the host
        # registered it, unless the job or the model names one): its own NVLink reaches lent memory
        return SimulatorProbe(cost, engine, workload, policy=params.get("policy") or "fcfs", gpu=gpu)
    except ValueError as exc:
        raise ProfilingError(f"cannot simulate {model.name!r}: {exc}") from None


def run_profile(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The `profile` job's runner (params validated by jobs.kinds.profile.ProfileParams)."""
    from planning.engine_probe import AgentEngineProbe

    model = ServedModel.objects.filter(name=params["model"]).first()
    if model is None:
        raise ProfilingError(f"model {params['model']!r} no longer exists")
    sla = sla_of(model)
    workload = workload_of(model, params)
    config = config_of(params)
    backend = params.get("backend", "simulator")
    probe: RateProbe
    if backend == "engine":
        probe = AgentEngineProbe.for_model(
            model,
            workload,
            deployment_id=params.get("deployment"),
            job_id=job_id_of(ctx),
            should_cancel=cancel_fn(ctx),
            timeout_s=float(params.get("probe_timeout_s", 600.0)),
        )
    else:
        probe = simulator_probe(model, params, workload)
    try:
        profile = profile_model(
            model.name,
            probe,
            sla,
            workload,
            config,
            progress=progress_fn(ctx, 0.0, 0.99),
            should_cancel=cancel_fn(ctx),
        )
    except ProfilingCancelled:
        raise JobCancelled(job_id_of(ctx)) from None
    # Stored as the job finishes, in the transaction that marks it succeeded (JobContext.on_success).
    ctx.on_success(partial(store_profile, model, profile, backend, job_id_of(ctx)))
    return {"backend": backend, **profile.to_dict()}


@transaction.atomic
def store_profile(model: ServedModel, profile: Profile, backend: str, job_id: int | None) -> ModelProfile:
    """Make `profile` the model's current profile, unless the job was cancelled meanwhile.
    The profile job's outcome: run in the transaction that marks the job succeeded.

    Raises:
        ProfilingError: the model was deleted while it was profiled (nothing is stored).
    """
    if job_id is not None:
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.status != JobStatus.RUNNING:
            raise JobCancelled(job_id)
    # The model's rows, locked until the profile is stored, in the order a delete of the model
    # takes them (its profile's row, then its own; an edit locks its own alone): a delete meanwhile
    # waits or is seen. With its own row first, PostgreSQL aborted one of the two as a deadlock.
    list(ModelProfile.objects.select_for_update().filter(model_id=model.pk).values_list("pk", flat=True))
    if not ServedModel.objects.select_for_update(no_key=True).filter(pk=model.pk).exists():
        raise ProfilingError(f"model {model.name!r} was deleted while it was profiled; nothing was stored")
    data = profile.to_dict()
    stored, _ = ModelProfile.objects.update_or_create(
        model=model,
        defaults={
            "backend": backend,
            "role": profile.role,
            "max_rps": profile.max_rps,
            "capped": profile.capped,
            "kv_capacity_bytes": profile.kv_capacity_bytes,
            "free_kv_bytes": profile.free_kv_bytes,
            "lendable_bytes": profile.lendable_bytes,
            "swap_needed_bytes": data["swap_needed_bytes"],
            "cost_model": data["cost_model"],
            "slo_ttft_p99_ms": model.slo_ttft_p99_ms,
            "slo_tbt_p99_ms": model.slo_tbt_p99_ms,
            "tensor_parallel_size": model.tensor_parallel_size,
            "data": data,
            "job_id": job_id,
        },
    )
    return stored
