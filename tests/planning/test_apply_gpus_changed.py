"""A plan sizes its models for the GPUs it saw: applying it after the GPUs of a host it starts a
model on changed (a smaller GPU, NVLink gone, a GPU added) is refused with a 409 naming the host and
the change, on the API and on the dashboard alike, and changes nothing."""

from __future__ import annotations

import pytest
from accounts.models import User
from django.test import Client
from inventory.models import Device, DeviceKind, Host
from planning.models import PlacementPlan
from rest_framework.test import APIClient

from tests.planning.helpers import (
    GIB,
    deployment_rows,
    result_of,
    run_job_via_api,
)
from tests.planning.test_audit_apply import cluster  # noqa: F401 (a fixture: host-a runs p10 and p6)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cluster")]


def change_host_b(change: str) -> None:
    gpus = Device.objects.filter(host__name="host-b")
    if change == "smaller":
        gpus.filter(index=1).update(memory_total_bytes=20 * GIB)
    elif change == "nvlink":
        gpus.update(nvlink_peers=[])
    else:
        Device.objects.create(
            host=Host.objects.get(name="host-b"),
            index=2,
            uuid="GPU-host-b-2",
            name="NVIDIA H100 80GB HBM3",
            kind=DeviceKind.GPU,
            memory_total_bytes=80 * GIB,
            nvlink_peers=[],
        )


@pytest.mark.parametrize(
    ("change", "needle"),
    [("smaller", "now 2 GPU(s), the smallest of 20 GiB"), ("nvlink", "no NVLink"), ("added", "now 3 GPU(s)")],
)
def test_a_plan_onto_a_host_whose_gpus_changed_is_refused_and_changes_nothing(
    admin_client: APIClient, client: Client, alice: User, change: str, needle: str
) -> None:
    job = run_job_via_api(admin_client, "place", {})
    assert any(m["to_server"] == "host-b" for m in result_of(job)["moves"] if m["kind"] == "start")
    change_host_b(change)
    before = deployment_rows()
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 409, response.content
    detail = response.data["detail"]
    assert "host 'host-b'" in detail and "was 2 GPU(s), the smallest of 80 GiB, NVLink" in detail
    assert needle in detail and "run a new place job" in detail
    client.force_login(alice)
    page = client.post(f"/jobs/{job.pk}/apply/")
    assert page.status_code == 409 and "host &#x27;host-b&#x27;" in page.content.decode()
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=job).applied_at is None


def test_a_plan_still_applies_when_only_a_host_it_leaves_alone_changed(
    admin_client: APIClient,
) -> None:
    job = run_job_via_api(admin_client, "place", {"models": ["c6"]})
    assert [(m["kind"], m["to_server"]) for m in result_of(job)["moves"]] == [("start", "host-b")]
    Device.objects.filter(host__name="host-a").update(memory_total_bytes=40 * GIB)
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200, response.content
    assert response.data["applied"] is True
