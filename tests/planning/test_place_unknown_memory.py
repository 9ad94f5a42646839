"""GPUs whose memory is unknown (registered with 0 bytes: a unified-memory GPU such as the GB10 of
a DGX Spark, whose driver does not report it) in placing: the placer needs each GPU's memory, and a
host of 0-byte GPUs failed every place job (`gpu_memory_bytes=0 must be positive`), so one DGX
Spark in the fleet stopped placement everywhere. Such GPUs are left out of placement, like GPUs of
models outside the plan, and a plan onto the other hosts applies."""

from __future__ import annotations

import pytest
from inventory.models import Device, DeviceKind, Host, HostStatus
from jobs.models import JobStatus
from rest_framework.test import APIClient

from tests.planning.helpers import (
    GIB,
    make_host,
    make_model,
    placement,
    result_of,
    run_job_via_api,
    store_profile,
)


def make_spark(name: str) -> Host:
    host = Host.objects.create(name=name, address="10.0.0.5", status=HostStatus.ONLINE)
    Device.objects.create(
        host=host, index=0, uuid=f"GPU-{name}", name="NVIDIA GB10", kind=DeviceKind.GPU, memory_total_bytes=0
    )
    return host


@pytest.mark.django_db
def test_a_place_job_leaves_gpus_of_unknown_memory_alone_and_places_on_the_others(
    admin_client: APIClient,
) -> None:
    make_spark("spark-1")
    make_host("h100-box", gpus=1)
    store_profile(make_model("p"), "producer", 4 * GIB)

    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    plan = result_of(job)["plan"]
    assert [(a["model"], a["server"]) for a in plan["assignments"]] == [("p", "h100-box")]
    assert [s["name"] for s in plan["servers"]] == ["h100-box"]
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 200, response.data
    assert placement() == {"p": ("h100-box", [0])}


@pytest.mark.django_db
def test_a_place_job_with_only_gpus_of_unknown_memory_says_so(admin_client: APIClient) -> None:
    make_spark("spark-1")
    store_profile(make_model("p"), "producer", 4 * GIB)

    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "PlacementError: no hosts with GPU devices to place on (memory unknown, left out: spark-1)"
    )
