"""Job result views: a placement plan as a server x GPU grid with its diff and Apply; a profile curve."""

from __future__ import annotations

import json
import re

import pytest
from deployments.models import Deployment, DesiredState
from django.test import Client
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.models import PlacementPlan

from tests.planning.helpers import (
    GIB,
    deploy,
    deployment_rows,
    make_host,
    make_model,
    placement,
    store_profile,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def place_job(admin_client: Client) -> Job:
    """A succeeded place job over two 2-GPU hosts: both producers on host-a today, consumers not deployed."""
    host_a, _ = make_host("host-a"), make_host("host-b")
    sizes = {"p10": ("producer", 10), "p6": ("producer", 6), "c10": ("consumer", 10), "c6": ("consumer", 6)}
    models = {name: make_model(name) for name in sizes}
    for name, (role, gib) in sizes.items():
        store_profile(models[name], role, gib * GIB)
    deploy(models["p10"], host_a, 0)
    deploy(models["p6"], host_a, 1)
    response = admin_client.post("/jobs/start/", {"kind": "place", "params": '{"time_limit_s": 10}'})
    assert response.status_code == 302
    job = Job.objects.get(kind="place")
    run_job(job.pk)  # the Celery task function, in this process
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    return job


def _grid(page: str) -> dict[str, list[tuple[str, bool]]]:
    """server -> [(model or "·", changed)] per GPU, read from the rendered grid."""
    table = re.search(r'<table class="grid" id="plan-grid">(.*?)</table>', page, re.S)
    assert table is not None
    rows = {}
    for server, cells in re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", table[1], re.S):
        rows[server] = [
            (text, cls == "changed") for cls, text in re.findall(r'<td class="(.*?)">(.*?)</td>', cells)
        ]
    return rows


def test_it_draws_the_plan_as_a_grid_marks_the_changes_and_lets_admins_apply_it(
    admin_client: Client, viewer_client: Client, place_job: Job
) -> None:
    plan = PlacementPlan.objects.get(job=place_job)
    page = admin_client.get(f"/jobs/{place_job.pk}/").content.decode()
    grid = _grid(page)
    assert sorted(grid) == ["host-a", "host-b"] and all(len(cells) == 2 for cells in grid.values())
    planned = {a["model"]: (a["server"], a["gpus"]) for a in plan.plan["assignments"]}
    moved = {m["model"] for m in plan.moves}
    for model, (server, gpus) in planned.items():
        for gpu in gpus:
            assert grid[server][gpu] == (model, model in moved)
    assert page.count("<li>start ") == 2 and page.count("<li>move ") == 1  # the diff against today
    assert 'id="apply-plan"' in page
    assert 'id="apply-plan"' not in viewer_client.get(f"/jobs/{place_job.pk}/").content.decode()

    assert viewer_client.post(f"/jobs/{place_job.pk}/apply/").status_code == 403
    assert placement() == {"p10": ("host-a", [0]), "p6": ("host-a", [1])}
    response = admin_client.post(f"/jobs/{place_job.pk}/apply/")
    assert response.status_code == 302
    assert 'id="notice">Applied 3 change(s).' in admin_client.get(response["Location"]).content.decode()
    plan.refresh_from_db()
    assert plan.applied_at is not None
    assert placement() == {model: (server, list(gpus)) for model, (server, gpus) in planned.items()}


def test_it_shows_the_profile_curve_with_the_slo_and_the_max_rate(viewer_client: Client) -> None:
    result = {
        "model": "m",
        "sla": {"ttft_p99_s": 0.5, "tbt_p99_s": 0.05},
        "curve": [
            {"rate": 1.0, "ttft_p99_s": 0.1, "tbt_p99_s": 0.02},
            {"rate": 4.0, "ttft_p99_s": 0.9, "tbt_p99_s": 0.08},
        ],
        "max_rps": 2.5,
        "capped": False,
        "role": "producer",
    }
    job = Job.objects.create(kind="profile", status=JobStatus.SUCCEEDED, progress=1.0, result=result)
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert '<strong id="max-rps">2.5</strong>' in page
    shown = json.loads(re.search(r'id="profile-result"[^>]*>(.*?)</script>', page, re.S)[1])  # type: ignore[index]
    assert shown == result
    assert 'id="chart-profile"' in page and "dashboard/profile.js" in page


def test_a_refused_apply_shows_the_job_page_with_the_reason_and_changes_nothing(
    admin_client: Client, place_job: Job
) -> None:
    Deployment.objects.filter(model__name="p6").update(desired_state=DesiredState.STOPPED)  # now stale
    before = deployment_rows()
    response = admin_client.post(f"/jobs/{place_job.pk}/apply/")
    assert response.status_code == 409
    page = response.content.decode()
    # The job's own page (navigation, grid, a live socket checked at the job's URL), not a bare text.
    assert f"<h1>Job {place_job.pk}: place</h1>" in page and 'id="plan-grid"' in page
    assert f'data-page="/jobs/{place_job.pk}/"' in page
    assert re.search(r'id="refusal">Not applied: The deployments changed since this plan was computed', page)
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=place_job).applied_at is None

    profile_job = Job.objects.create(kind="profile", status=JobStatus.RUNNING)
    response = admin_client.post(f"/jobs/{profile_job.pk}/apply/")
    assert response.status_code == 404
    page = response.content.decode()
    assert f'id="refusal">Not applied: job {profile_job.pk} is a running profile job' in page


def test_the_plan_page_names_the_models_a_plan_left_alone(admin_client: Client, db: None) -> None:
    host = make_host("host-a")
    profiled, unprofiled = make_model("p6"), make_model("tiny")
    store_profile(profiled, "producer", 6 * GIB)
    deploy(unprofiled, host, 1)
    assert admin_client.post("/jobs/start/", {"kind": "place", "params": "{}"}).status_code == 302
    job = Job.objects.get(kind="place")
    run_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    page = admin_client.get(f"/jobs/{job.pk}/").content.decode()
    assert '<p id="plan-left-out">Left alone (no profile): tiny</p>' in page
