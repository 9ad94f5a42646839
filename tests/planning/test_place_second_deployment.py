"""A planned model running twice: the plan places it once, so applying it stops the second
deployment, and the moves the place job shows say so (they are what Apply does)."""

from __future__ import annotations

import pytest
from deployments.models import Deployment, DesiredState
from inventory.models import Host
from jobs.models import JobStatus
from rest_framework.test import APIClient

from tests.planning.helpers import GIB, deploy, make_model, result_of, run_job_via_api, store_profile

pytestmark = pytest.mark.django_db


def test_the_moves_shown_include_stopping_a_planned_models_second_deployment(
    admin_client: APIClient, two_hosts: tuple[Host, Host]
) -> None:
    host_a, host_b = two_hosts
    model = make_model("p")
    store_profile(model, "producer", 10 * GIB)
    first = deploy(model, host_a, 0)
    second = deploy(model, host_b, 1)

    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    shown = result_of(job)["moves"]
    # the plan keeps the first deployment where it is (fewest moves) and runs the model once
    assert result_of(job)["plan"]["assignments"] == [{"model": "p", "server": "host-a", "gpus": [0]}]
    assert shown == [
        {
            "model": "p",
            "kind": "stop",
            "from_server": "host-b",
            "from_gpus": [1],
            "to_server": None,
            "to_gpus": [],
        }
    ]

    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200, response.data
    assert response.data["applied"] is True and response.data["moves"] == shown
    states = dict(Deployment.objects.values_list("pk", "desired_state"))
    assert states == {first.pk: DesiredState.RUNNING, second.pk: DesiredState.STOPPED}
