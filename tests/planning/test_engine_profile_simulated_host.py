"""Audit of a production-shaped deployment: engine profiles of deployments on simulated hosts.

A simulated host's agent (``python -m gpu_agent --simulate 8xH100``) has no engine: it answers every
probe "deployment '2' cannot be probed on this host (sim-1)". An engine profile of a deployment
there was accepted (201) and failed in the worker; it is now a 400 naming the field, and a profile
that names no deployment probes the model's first running deployment on a real host.
"""

from __future__ import annotations

import pytest
from deployments.models import Deployment, ObservedState
from jobs.models import Job
from planning.engine_probe import running_deployment
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import deploy, make_host, make_model

pytestmark = pytest.mark.django_db
URL = "/api/v1/jobs/"
ENGINE = {"model": "llama-3-8b", "backend": "engine"}


def _running(model: ServedModel, host_name: str, simulated: bool) -> Deployment:
    deployment = deploy(model, make_host(host_name, simulated=simulated), 0)
    Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.RUNNING)
    return deployment


def test_an_engine_profile_of_a_deployment_on_a_simulated_host_is_a_400(admin_client: APIClient) -> None:
    model = make_model("llama-3-8b")
    deployment = _running(model, "sim-1", simulated=True)

    named = admin_client.post(
        URL,
        {
            "kind": "profile",
            "params": {"model": "llama-3-8b", "backend": "engine", "deployment": deployment.pk},
        },
        format="json",
    )
    unnamed = admin_client.post(URL, {"kind": "profile", "params": ENGINE}, format="json")

    assert named.status_code == 400, named.data
    assert named.data["params"]["deployment"] == [
        f"Deployment {deployment.pk} runs on simulated host 'sim-1', which has no engine to probe (profile "
        "a deployment on a real host, or use the simulator backend)."
    ]
    assert unnamed.status_code == 400, unnamed.data
    assert unnamed.data["params"]["backend"] == [
        "Model 'llama-3-8b' has no running deployment on a real host to profile (deploy it on a host with "
        "an engine, or use the simulator backend)."
    ]
    assert not Job.objects.exists()


def test_an_engine_profile_naming_no_deployment_probes_the_first_one_on_a_real_host(
    admin_client: APIClient,
) -> None:
    model = make_model("llama-3-8b")
    _running(model, "sim-1", simulated=True)  # the model's first running deployment
    real = _running(model, "gpu-1", simulated=False)

    response = admin_client.post(URL, {"kind": "profile", "params": ENGINE}, format="json")

    assert response.status_code == 201, response.data
    assert running_deployment(model) == real
