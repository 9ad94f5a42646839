"""Strings the pages show come from admins (model names and fields, key names, job params), agents
(host and device names, job errors holding engine output) and plans: the server-rendered pages
show each as text, escaped, never as markup. The scripts' side (socket frames, the playground's
model output) is tests/browser/test_dashboard_live_frames.py and test_playground_streaming.py.

Rows are written straight to the database: the API's and the agents' validation (slugs, protocol
checks) must not be what stands between a stored string and the page.
"""

from __future__ import annotations

import pytest
from accounts.models import User
from accounts.services import create_api_key
from deployments.models import Deployment, DesiredState
from django.test import Client
from inventory.models import Device, DeviceKind, Host, HostStatus
from jobs.models import Job, JobStatus
from planning.models import PlacementPlan
from registry.models import ServedModel

from tests.dashboard.helpers import GIB, add_device_sample

pytestmark = pytest.mark.django_db

MARKUP = "<img src=x onerror=alert(1)>"
HOSTILE = "\"'>" + MARKUP + "</script><script>alert(2)</script>"
# How a page holds HOSTILE once escaped: as HTML text (attributes included), or in a json_script.
ESCAPED = ("&lt;img src=x onerror=alert(1)&gt;", "\\u003Cimg src=x onerror=alert(1)\\u003E")


def hostile_rows(owner: User) -> dict[str, int]:
    """A host, its GPU, a model deployed there, jobs (a failed one, a plan, a profile) and a key,
    every string field of them holding HOSTILE; the pks the pages are read at."""
    host = Host.objects.create(name="h" + HOSTILE, address="10.0.0.1", status=HostStatus.ONLINE)
    device = Device.objects.create(
        host=host,
        index=0,
        uuid="GPU-x",
        name="H100" + HOSTILE,
        kind=DeviceKind.GPU,
        memory_total_bytes=80 * GIB,
    )
    add_device_sample(device)
    model = ServedModel.objects.create(
        name="m" + HOSTILE,
        source="org/m" + HOSTILE,
        max_context_length=256,
        slo_ttft_p99_ms=500.0,
        slo_tbt_p99_ms=50.0,
        engine_options={"k" + HOSTILE: "v" + HOSTILE},
    )
    deployment = Deployment.objects.create(
        model=model, host=host, desired_state=DesiredState.RUNNING, observed_message="tail" + HOSTILE
    )
    deployment.devices.set([device])
    failed = Job.objects.create(
        kind="noop" + HOSTILE[: 50 - len("noop")],  # the column is 50 characters (PostgreSQL checks)
        params={"p" + HOSTILE: "v" + HOSTILE},
        status=JobStatus.FAILED,
        error="engine said" + HOSTILE,
        result={"r" + HOSTILE: "v" + HOSTILE},
    )
    left_out = {"left_out": ["lo" + HOSTILE]}
    place = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, result=left_out)
    PlacementPlan.objects.create(
        job=place,
        plan={
            "servers": [{"name": "s" + HOSTILE, "num_gpus": 1}],
            "assignments": [{"server": "s" + HOSTILE, "model": "m" + HOSTILE, "gpus": [0]}],
        },
        moves=[
            {
                "kind": "start",
                "model": "m" + HOSTILE,
                "from_server": None,
                "from_gpus": [],
                "to_server": "s" + HOSTILE,
                "to_gpus": [0],
            }
        ],
        fingerprint="f",
        model_ids=[model.pk],
    )
    profile = Job.objects.create(
        kind="profile",
        status=JobStatus.SUCCEEDED,
        result={"max_rps": 1.0, "role": "r" + HOSTILE, "curve": [], "sla": {"note": HOSTILE}},
    )
    create_api_key(owner, "key" + HOSTILE)
    return {
        "model": model.pk,
        "deployment": deployment.pk,
        "failed": failed.pk,
        "place": place.pk,
        "profile": profile.pk,
    }


def test_it_shows_hostile_strings_escaped_on_every_page_that_reads_them(
    admin_client: Client, admin_user: User
) -> None:
    pk = hostile_rows(admin_user)
    pages = [
        "/",
        "/models/",
        f"/models/{pk['model']}/",
        f"/models/{pk['model']}/edit/",
        "/jobs/",
        f"/jobs/{pk['failed']}/",
        f"/jobs/{pk['place']}/",
        f"/jobs/{pk['profile']}/",
        "/api-keys/",
        f"/deployments/{pk['deployment']}/logs/",
        "/playground/",
    ]
    for path in pages:
        response = admin_client.get(path)
        assert response.status_code == 200, path
        page = response.content.decode()
        assert MARKUP not in page and "<script>alert" not in page, path
        assert any(shown in page for shown in ESCAPED), f"{path} does not show the string at all"


def test_it_shows_a_refused_page_number_escaped(admin_client: Client) -> None:
    response = admin_client.get("/jobs/", {"page": HOSTILE})
    assert response.status_code == 400
    page = response.content.decode()
    assert MARKUP not in page and ESCAPED[0] in page
