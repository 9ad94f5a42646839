"""Helpers for planning tests: hosts with GPUs, models with stored profiles, deployments, and
starting a job through the API and running its task function."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment, DesiredState
from deployments.services import create_deployment
from inventory.models import Device, DeviceKind, Host, HostStatus
from jobs.kinds.profile import ProfileParams
from jobs.models import Job
from jobs.tasks import run_job
from planning.models import ModelProfile
from registry.models import ServedModel
from rest_framework.test import APIClient

GIB = 1 << 30


def make_host(
    name: str,
    gpus: int = 2,
    nvlink: bool = True,
    simulated: bool = False,
    status: str = HostStatus.ONLINE,
    gpu_name: str = "NVIDIA H100 80GB HBM3",
    memory_gib: int = 80,
) -> Host:
    """A host with `gpus` GPUs (H100s unless `gpu_name`/`memory_gib` say); online (as if its agent
    were connected) unless `status` says."""
    host = Host.objects.create(name=name, address="10.0.0.1", simulated=simulated, status=status)
    for i in range(gpus):
        peers = [j for j in range(gpus) if j != i] if nvlink else []
        Device.objects.create(
            host=host,
            index=i,
            uuid=f"GPU-{name}-{i}",
            name=gpu_name,
            kind=DeviceKind.GPU,
            memory_total_bytes=memory_gib * GIB,
            nvlink_peers=peers,
        )
    return host


def make_model(
    name: str, tp: int = 1, ttft_ms: float = 200.0, tbt_ms: float = 50.0, **options: Any
) -> ServedModel:
    return ServedModel.objects.create(
        name=name,
        source=f"org/{name}",
        tensor_parallel_size=tp,
        max_context_length=4096,
        slo_ttft_p99_ms=ttft_ms,
        slo_tbt_p99_ms=tbt_ms,
        engine_options=options,
    )


def store_profile(model: ServedModel, role: str, nbytes: int) -> ModelProfile:
    """A stored profile as a profile job leaves it (only the fields the placer reads vary)."""
    swap = {"2x": nbytes // 2, "4x": nbytes, "8x": 2 * nbytes} if role == "consumer" else {}
    lendable = nbytes if role == "producer" else 0
    data = {
        "model": model.name,
        "role": role,
        "max_rps": 5.0,
        "lendable_bytes": lendable,
        "swap_needed_bytes": swap,
    }
    return ModelProfile.objects.create(
        model=model,
        backend="simulator",
        role=role,
        max_rps=5.0,
        kv_capacity_bytes=40 * GIB,
        free_kv_bytes=lendable,
        lendable_bytes=lendable,
        swap_needed_bytes=swap,
        slo_ttft_p99_ms=model.slo_ttft_p99_ms,
        slo_tbt_p99_ms=model.slo_tbt_p99_ms,
        data=data,
    )


def deploy(model: ServedModel, host: Host, *indices: int) -> Deployment:
    return create_deployment(model, host, list(Device.objects.filter(host=host, index__in=indices)))


def placement() -> dict[str, tuple[str, list[int]]]:
    """model -> (host, device indices) of every deployment meant to run (one per model here)."""
    out: dict[str, tuple[str, list[int]]] = {}
    for d in Deployment.objects.filter(desired_state=DesiredState.RUNNING).order_by("pk"):
        assert d.model.name not in out, f"{d.model.name} runs twice"
        out[d.model.name] = (d.host.name, sorted(dev.index for dev in d.devices.all()))
    return out


def deployment_rows() -> list[tuple[int, str, str, str, list[int]]]:
    """Every deployment's (id, model, host, desired state, devices): to assert nothing changed."""
    return [
        (d.pk, d.model.name, d.host.name, d.desired_state, sorted(x.index for x in d.devices.all()))
        for d in Deployment.objects.order_by("pk")
    ]


def run_job_via_api(client: APIClient, kind: str, params: dict[str, Any]) -> Job:
    """POST the job (validated like any client's), then run its Celery task function here."""
    response = client.post("/api/v1/jobs/", {"kind": kind, "params": params}, format="json")
    assert response.status_code == 201, response.data
    job = Job.objects.get(pk=response.data["id"])
    run_job(job.pk)
    job.refresh_from_db()
    return job


def result_of(job: Job) -> dict[str, Any]:
    """The job's stored result (a succeeded job always has one)."""
    assert isinstance(job.result, dict), f"job {job.pk} is {job.status}: {job.error}"
    return job.result


# A short simulated profile of llama-3-8b on an H100 (the cost-model preset; no engine needed).
SIMULATED_PROFILE = {
    "model": "llama-3-8b",
    "preset_gpu": "h100",
    "workload": {"num_requests": 50, "burst_duration_s": 1.0},
    "rel_tol": 0.3,
    "burst_levels": [2],
}


def queued_profile_job() -> Job:
    """A queued `profile` job of SIMULATED_PROFILE, its parameters validated as the API does."""
    params = ProfileParams(data=SIMULATED_PROFILE)
    assert params.is_valid(), params.errors
    return Job.objects.create(kind="profile", params=dict(params.validated_data))
