"""Offline hosts (their agent gone) in placing and applying: a place job plans nothing onto them
(a model running on one is planned elsewhere), and a plan computed while a host was online that
starts or moves a model onto it after it went offline is a 409 that changes nothing, instead of
stopping the model where it runs and starting it where nothing will run it."""

from __future__ import annotations

import pytest
from inventory.models import Host, HostStatus
from jobs.models import JobStatus
from planning.models import PlacementPlan
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import (
    GIB,
    deploy,
    deployment_rows,
    make_host,
    make_model,
    placement,
    result_of,
    run_job_via_api,
    store_profile,
)


@pytest.fixture
def hosts(db: None) -> tuple[Host, Host]:
    return make_host("host-a", gpus=1), make_host("host-b", gpus=1)


def _go_offline(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)


@pytest.mark.django_db
def test_a_place_job_plans_nothing_onto_an_offline_host(
    admin_client: APIClient, hosts: tuple[Host, Host]
) -> None:
    host_a, host_b = hosts
    store_profile(make_model("p"), "producer", 4 * GIB)
    deploy(ServedModel.objects.get(name="p"), host_b, 0)  # runs there; then its agent goes
    _go_offline(host_b)

    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert [(a["model"], a["server"]) for a in result_of(job)["plan"]["assignments"]] == [("p", "host-a")]
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200, response.data
    assert placement() == {"p": ("host-a", [0])}

    _go_offline(host_a)
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.FAILED
    assert job.error == "PlacementError: no hosts with GPU devices to place on (offline: host-a, host-b)"


@pytest.mark.django_db
def test_a_plan_onto_a_host_gone_offline_since_is_refused_and_changes_nothing(
    admin_client: APIClient, hosts: tuple[Host, Host]
) -> None:
    host_a, host_b = hosts
    store_profile(make_model("p"), "producer", 4 * GIB)
    store_profile(make_model("c"), "consumer", 4 * GIB)
    deploy(ServedModel.objects.get(name="p"), host_a, 0)
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    (start,) = [m for m in result_of(job)["moves"] if m["model"] == "c"]
    assert start["kind"] == "start" and start["to_server"] == "host-b"
    _go_offline(host_b)

    before = deployment_rows()
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 409, response.data
    assert response.data["detail"] == (
        "The plan starts models on offline host(s) 'host-b', whose agent is not connected; "
        "bring the host back online or run a new place job."
    )
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=job).applied_at is None
