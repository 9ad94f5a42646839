"""Profile jobs of models stored before the registry checked their settings (engine_options naming
no cost-model preset, a context shorter than a prompt and an answer): refused at POST naming the
field, and failed by the worker with the same message, not a cost-model or workload traceback."""

from __future__ import annotations

from typing import Any

import pytest
from deployments.models import Deployment, ObservedState
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.models import ModelProfile
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import deploy, make_host, make_model

pytestmark = pytest.mark.django_db
URL = "/api/v1/jobs/"


def stored_with(name: str, **fields: Any) -> ServedModel:
    """A model row as an older release stored it: written past the model's validators."""
    model = make_model(name)
    ServedModel.objects.filter(pk=model.pk).update(**fields)
    return model


def run_queued(params: dict[str, Any]) -> Job:
    """The job as the worker leaves it, had it been queued before the model changed."""
    job = Job.objects.create(kind="profile", params=params, status=JobStatus.QUEUED)
    run_job(job.pk)
    job.refresh_from_db()
    return job


@pytest.mark.parametrize(
    ("options", "field", "needle"),
    [
        ({"sim_model": "gpt-17", "sim_gpu": "h100"}, "preset_model", "engine_options.sim_model 'gpt-17'"),
        ({"sim_gpu": "rtx9090"}, "preset_gpu", "engine_options.sim_gpu 'rtx9090'"),
    ],
)
def test_a_profile_of_a_model_whose_engine_options_name_no_preset_is_refused_at_post(
    admin_client: APIClient, viewer_client: APIClient, options: dict[str, Any], field: str, needle: str
) -> None:
    stored_with("llama-3-8b", engine_options=options)
    params = {"model": "llama-3-8b"}
    assert viewer_client.post(URL, {"kind": "profile", "params": params}, format="json").status_code == 403
    response = admin_client.post(URL, {"kind": "profile", "params": params}, format="json")
    assert response.status_code == 400, response.data
    errors = response.data["params"]
    assert set(errors) == {field}, errors
    assert needle in str(errors[field][0]) and "not a cost-model preset" in str(errors[field][0])
    assert not Job.objects.exists()

    job = run_queued(params)
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(f"ProfilingError: model 'llama-3-8b' has {needle}"), job.error
    assert not ModelProfile.objects.exists()

    # presets the job names itself take the place of the stored ones
    named = {**params, "preset_model": "llama-3-8b", "preset_gpu": "h100"}
    assert admin_client.post(URL, {"kind": "profile", "params": named}, format="json").status_code == 201


@pytest.mark.parametrize("backend", ["simulator", "engine"])
def test_a_profile_of_a_model_whose_context_fits_no_request_is_refused_at_post(
    admin_client: APIClient, backend: str
) -> None:
    model = stored_with("llama-3-8b", max_context_length=1)
    if backend == "engine":
        deployment = deploy(model, make_host("gpu-a"), 0)
        Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.RUNNING)
    params = {"model": "llama-3-8b", "preset_gpu": "h100", "backend": backend}
    response = admin_client.post(URL, {"kind": "profile", "params": params}, format="json")
    assert response.status_code == 400, response.data
    errors = response.data["params"]
    assert set(errors) == {"model"}, errors
    assert "Model 'llama-3-8b' has max_context_length=1, below 2" in str(errors["model"][0])
    assert not Job.objects.exists()

    job = run_queued(params)
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("ProfilingError: model 'llama-3-8b' has max_context_length=1"), job.error
    assert not ModelProfile.objects.exists()

    # at the minimum (what the API now allows) a request of one prompt and one output token fits
    ServedModel.objects.filter(pk=model.pk).update(max_context_length=2)
    if backend == "simulator":
        shortest = {**params, "workload": {"num_requests": 20}, "max_rate": 8.0}
        job = run_queued(shortest)
        assert job.status == JobStatus.SUCCEEDED, job.error
        assert (job.result or {})["workload"]["max_context"] == 2
