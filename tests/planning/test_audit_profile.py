"""Profile jobs, audited: parameters the worker would refuse (or choke on) are 400s at POST naming
the field; a second profile job of a model is refused while one runs; probes of a job that no
longer runs are not relayed to the agent."""

from __future__ import annotations

from typing import Any

import pytest
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import update_deployment
from inventory.models import Host
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.models import ModelProfile, ProbeRequest, ProbeStatus
from planning.relay import claim_pending
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import deploy, make_host, make_model

pytestmark = pytest.mark.django_db
URL = "/api/v1/jobs/"
BASE = {"model": "llama-3-8b", "preset_gpu": "h100"}


@pytest.mark.parametrize(
    ("params", "path"),
    [
        # a burst replays about rate x level x duration requests: these never fit in a worker
        ({**BASE, "workload": {"burst_duration_s": 1e9}}, ("workload", "burst_duration_s")),
        ({**BASE, "burst_levels": [2.0, 1e9]}, ("burst_levels",)),
        # levels named alike ("4x") would overwrite each other in the stored profile
        ({**BASE, "burst_levels": [4.0, 4.0000001]}, ("burst_levels",)),
        ({**BASE, "burst_levels": [2, 2]}, ("burst_levels",)),
        ({**BASE, "max_rate": 1e12}, ("max_rate",)),
        # the worker failed on these (numpy's seed, the cost-model presets, the policy registry)
        ({**BASE, "workload": {"seed": -1}}, ("workload", "seed")),
        ({**BASE, "preset_model": "llama-9"}, ("preset_model",)),
        ({**BASE, "preset_gpu": "h1000"}, ("preset_gpu",)),
        ({**BASE, "policy": "lifo"}, ("policy",)),
        ({**BASE, "max_rate": 0.5}, ("max_rate",)),  # below the profiler's default initial rate 1.0
        ({**BASE, "initial_rate": 20_000.0}, ("initial_rate",)),  # above its default max 10,000
        # a boolean is not a number
        ({**BASE, "initial_rate": True}, ("initial_rate",)),
        ({**BASE, "burst_levels": [True]}, ("burst_levels",)),
        ({**BASE, "workload": {"burstiness": True}}, ("workload", "burstiness")),
    ],
)
def test_it_refuses_parameters_the_worker_cannot_run_with_400_naming_the_field(
    admin_client: APIClient, params: dict[str, Any], path: tuple[str, ...]
) -> None:
    make_model("llama-3-8b")
    response = admin_client.post(URL, {"kind": "profile", "params": params}, format="json")
    assert response.status_code == 400, response.data
    errors = response.data["params"]
    for key in path:
        assert key in errors, errors
        errors = errors[key]
    assert not Job.objects.exists()


def test_it_refuses_a_placement_burst_level_no_profile_can_have(admin_client: APIClient) -> None:
    response = admin_client.post(URL, {"kind": "place", "params": {"burst_level": 1e300}}, format="json")
    assert response.status_code == 400
    assert "burst_level" in response.data["params"]


def test_it_accepts_the_largest_values_it_allows(admin_client: APIClient) -> None:
    make_model("llama-3-8b")
    params = {
        **BASE,
        "preset_model": "llama-3-8b",
        "policy": "fcfs",
        "workload": {"seed": 2**32 - 1, "burst_duration_s": 600.0},
        "burst_levels": [64.0],
        "max_rate": 100_000.0,
    }
    response = admin_client.post(URL, {"kind": "profile", "params": params}, format="json")
    assert response.status_code == 201, response.data


def test_it_refuses_a_second_profile_job_of_a_model_while_one_is_active(
    admin_client: APIClient, viewer_client: APIClient
) -> None:
    make_model("llama-3-8b")
    make_model("other", sim_model="llama-3-8b")  # a preset the simulator can run it with
    first = admin_client.post(URL, {"kind": "profile", "params": BASE}, format="json")
    assert first.status_code == 201
    for status in (JobStatus.QUEUED, JobStatus.RUNNING):
        Job.objects.filter(pk=first.data["id"]).update(status=status)
        again = admin_client.post(
            URL, {"kind": "profile", "params": {**BASE, "backend": "engine"}}, format="json"
        )
        assert again.status_code == 400
        assert f"Profile job {first.data['id']} of this model is already {status}" in str(
            again.data["params"]["model"]
        )
    assert Job.objects.count() == 1
    # another model, or the same once the first finished, is fine
    other = admin_client.post(URL, {"kind": "profile", "params": {**BASE, "model": "other"}}, format="json")
    assert other.status_code == 201
    Job.objects.filter(pk=first.data["id"]).update(status=JobStatus.CANCELLED)
    assert admin_client.post(URL, {"kind": "profile", "params": BASE}, format="json").status_code == 201
    assert viewer_client.post(URL, {"kind": "profile", "params": BASE}, format="json").status_code == 403


def test_it_does_not_relay_the_probes_of_a_job_that_no_longer_runs() -> None:
    host = make_host("gpu-a")
    running = Job.objects.create(kind="profile", status=JobStatus.RUNNING)
    lost = Job.objects.create(kind="profile", status=JobStatus.FAILED, error="Worker lost: ...")
    for probe_id, job in (("p-lost", lost), ("p-running", running), ("p-no-job", None)):
        ProbeRequest.objects.create(probe_id=probe_id, host=host, job=job, frame={"probe_id": probe_id})
    frames = claim_pending([host.pk])
    assert [f["probe_id"] for f in frames[host.pk]] == ["p-running", "p-no-job"]
    stale = ProbeRequest.objects.get(probe_id="p-lost")
    assert stale.status == ProbeStatus.CANCELLED and stale.finished_at is not None
    assert claim_pending([host.pk]) == {}


def running_deployment_of(model: ServedModel, host: Host, index: int) -> Deployment:
    deployment = deploy(model, host, index)
    Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.RUNNING)
    return deployment


@pytest.mark.parametrize(
    ("params", "field", "needle"),
    [
        ({"model": "tiny", "backend": "engine", "deployment": 99999}, "deployment", "is not a running"),
        ({"model": "tiny", "backend": "engine", "deployment": 10**20}, "deployment", "is not a running"),
        ({"model": "tiny", "backend": "engine", "deployment": "other"}, "deployment", "is not a running"),
        ({"model": "tiny", "backend": "engine", "deployment": "stopped"}, "deployment", "is not a running"),
        ({"model": "tiny", "backend": "engine"}, "backend", "has no running deployment to profile"),
        ({"model": "tiny", "preset_gpu": "h100"}, "preset_model", "No cost-model preset for model 'tiny'"),
        ({"model": "llama-3-8b"}, "preset_gpu", "No GPU preset for model 'llama-3-8b'"),
    ],
)
def test_it_refuses_a_profile_whose_deployment_or_preset_the_worker_would_not_find(
    admin_client: APIClient, params: dict[str, Any], field: str, needle: str
) -> None:
    host = make_host("gpu-a")
    tiny = make_model("tiny")
    make_model("llama-3-8b")
    other = running_deployment_of(make_model("other"), host, 0)
    stopped = deploy(tiny, host, 1)  # not yet reported running by its agent
    params = {**params}
    if params.get("deployment") in ("other", "stopped"):
        params["deployment"] = {"other": other, "stopped": stopped}[params["deployment"]].pk
    response = admin_client.post(URL, {"kind": "profile", "params": params}, format="json")
    assert response.status_code == 400, response.data
    errors = response.data["params"]
    assert set(errors) == {field}, errors
    assert needle in str(errors[field][0])
    assert not Job.objects.exists()


def test_the_deployment_and_the_preset_are_checked_at_post_and_again_when_the_job_runs(
    admin_client: APIClient, viewer_client: APIClient
) -> None:
    host = make_host("gpu-a")
    tiny = make_model("tiny", sim_model="llama-3-8b", sim_gpu="h100")
    deployment = running_deployment_of(tiny, host, 0)
    engine = {"model": "tiny", "backend": "engine", "deployment": deployment.pk}
    assert viewer_client.post(URL, {"kind": "profile", "params": engine}, format="json").status_code == 403
    queued = admin_client.post(URL, {"kind": "profile", "params": engine}, format="json")
    assert queued.status_code == 201, queued.data
    update_deployment(deployment, desired_state=DesiredState.STOPPED)  # while the job is queued
    Job.objects.filter(pk=queued.data["id"]).update(status=JobStatus.CANCELLED)
    refused = admin_client.post(URL, {"kind": "profile", "params": engine}, format="json")
    assert refused.status_code == 400 and set(refused.data["params"]) == {"deployment"}
    Job.objects.filter(pk=queued.data["id"]).update(status=JobStatus.QUEUED)
    run_job(queued.data["id"])
    job = Job.objects.get(pk=queued.data["id"])
    assert job.status == JobStatus.FAILED
    assert f"deployment {deployment.pk} is not a running deployment of model 'tiny'" in job.error
    assert not ProbeRequest.objects.exists()

    simulated = admin_client.post(URL, {"kind": "profile", "params": {"model": "tiny"}}, format="json")
    assert simulated.status_code == 201, simulated.data
    ServedModel.objects.filter(pk=tiny.pk).update(engine_options={})  # its presets removed meanwhile
    Job.objects.filter(pk=simulated.data["id"]).update(status=JobStatus.CANCELLED)
    refused = admin_client.post(URL, {"kind": "profile", "params": {"model": "tiny"}}, format="json")
    assert refused.status_code == 400 and set(refused.data["params"]) == {"preset_model", "preset_gpu"}
    Job.objects.filter(pk=simulated.data["id"]).update(status=JobStatus.QUEUED)
    run_job(simulated.data["id"])
    job = Job.objects.get(pk=simulated.data["id"])
    assert job.status == JobStatus.FAILED and "no cost-model preset for model 'tiny'" in job.error
    assert not ModelProfile.objects.exists()
