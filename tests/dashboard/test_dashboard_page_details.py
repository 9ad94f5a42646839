"""Dashboard audit: lending on a device that lends to its own engine, the attainment's span named on
the model page, a profile job page without a result loading no chart script, the plan grid's GPU
columns named, the playground's message box labelled."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from dashboard import snapshots
from deployments.models import Deployment
from django.test import Client
from django.utils import timezone
from inventory.models import Device, DeviceKind, Host
from inventory.services import register_host
from jobs.models import Job, JobStatus
from planning.models import PlacementPlan

from tests.dashboard.helpers import GIB, add_device_sample, add_engine_sample

pytestmark = pytest.mark.django_db


def _cpu_host() -> Device:
    host = register_host("cpu-a", "127.0.0.1")
    return Device.objects.create(
        host=host,
        index=0,
        uuid="CPU-a-0",
        name="host memory",
        kind=DeviceKind.CPU,
        memory_total_bytes=64 * GIB,
    )


def test_a_device_lending_to_its_own_engine_is_paired_with_itself() -> None:
    # What gpu_agent.aqua.device_states reports when the producer CLI lends host memory on a CPU
    # host and that host's engine borrows it: a consumer with lent bytes, paired with itself.
    cpu = _cpu_host()
    add_device_sample(cpu, aqua_role="consumer", lent_bytes=4 * GIB, borrowed_bytes=GIB, paired_with=0)
    assert snapshots.pairings(snapshots.overview()) == [{"host": cpu.host_id, "lender": 0, "borrower": 0}]


def test_a_consumer_that_lends_is_paired_with_its_borrower_not_with_its_lender(host: Host) -> None:
    d0, d1 = Device.objects.filter(host=host).order_by("index")
    d2 = Device.objects.create(
        host=host, index=2, uuid="GPU-sim-a-2", name="H100", kind=DeviceKind.GPU, memory_total_bytes=80 * GIB
    )
    # GPU 1 borrows from GPU 0 and lends to GPU 2; it reports itself as a consumer paired with one side.
    add_device_sample(d0, aqua_role="producer", lent_bytes=8 * GIB, paired_with=1)
    add_device_sample(d1, aqua_role="consumer", lent_bytes=4 * GIB, borrowed_bytes=2 * GIB, paired_with=2)
    add_device_sample(d2, aqua_role="consumer", borrowed_bytes=GIB, paired_with=1)
    pairs = [(p["lender"], p["borrower"]) for p in snapshots.pairings(snapshots.overview())]
    assert pairs == [(0, 1), (1, 2)]
    # Paired with its lender instead (the agent names one side only): listed as that one's borrower.
    add_device_sample(d1, aqua_role="consumer", lent_bytes=4 * GIB, borrowed_bytes=2 * GIB, paired_with=0)
    pairs = [(p["lender"], p["borrower"]) for p in snapshots.pairings(snapshots.overview())]
    assert pairs == [(0, 1)]


@pytest.mark.parametrize(
    ("seconds", "label"), [(60, "last minute"), (300, "last 5 minutes"), (30, "last 30 s"), (90, "last 90 s")]
)
def test_spans_are_named_as_a_page_says_them(seconds: int, label: str) -> None:
    assert snapshots.span_label(timedelta(seconds=seconds)) == label


def test_the_model_page_says_its_attainment_covers_the_last_minute(
    viewer_client: Client, deployment: Deployment
) -> None:
    # Two minutes old: drawn in the charts (10 minutes of history), not judged in the attainment.
    add_engine_sample(deployment, timezone.now() - timedelta(minutes=2))
    page = viewer_client.get(f"/models/{deployment.model_id}/").content.decode()
    assert "Attainment over the last minute" in page
    assert 'data-empty="no samples in the last minute"' in page
    assert ">no samples in the last minute</dd>" in page
    add_engine_sample(deployment, timezone.now() - timedelta(seconds=1))
    page = viewer_client.get(f"/models/{deployment.model_id}/").content.decode()
    assert ">100.0%</dd>" in page


@pytest.mark.parametrize("status", [JobStatus.RUNNING, JobStatus.FAILED])
def test_a_profile_job_without_a_result_loads_no_profile_chart_script(
    viewer_client: Client, status: JobStatus
) -> None:
    job = Job.objects.create(kind="profile", params={"model": "m"}, status=status, error="boom")
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "dashboard/profile.js" not in page and 'id="profile-result"' not in page
    Job.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED, result={"max_rps": 1.0, "curve": []})
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "dashboard/profile.js" in page and 'id="profile-result"' in page


def test_the_plan_grid_names_its_gpu_columns(viewer_client: Client) -> None:
    job = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, result={})
    plan = {
        "servers": [{"name": "a", "num_gpus": 2}, {"name": "b", "num_gpus": 3}],
        "assignments": [{"model": "m", "server": "b", "gpus": [2]}],
    }
    PlacementPlan.objects.create(job=job, plan=plan, moves=[], fingerprint="x")
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    head = re.search(r'<table class="grid" id="plan-grid">\s*<thead>(.*?)</thead>', page, re.S)
    assert head is not None
    assert re.findall(r'<th scope="col">(.*?)</th>', head[1]) == ["GPU 0", "GPU 1", "GPU 2"]


def test_the_playground_message_box_has_an_accessible_name(viewer_client: Client) -> None:
    page = viewer_client.get("/playground/").content.decode()
    box = re.search(r'<textarea id="pg-input"[^>]*>', page)
    assert box is not None and 'aria-label="Message"' in box[0]


def test_an_applied_plan_no_longer_calls_its_moves_changes_from_today(viewer_client: Client) -> None:
    job = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, result={})
    plan = {
        "servers": [{"name": "a", "num_gpus": 1}],
        "assignments": [{"model": "m", "server": "a", "gpus": [0]}],
    }
    moves = [
        {
            "kind": "start",
            "model": "m",
            "from_server": None,
            "from_gpus": [],
            "to_server": "a",
            "to_gpus": [0],
        }
    ]
    row = PlacementPlan.objects.create(job=job, plan=plan, moves=moves, fingerprint="x")
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "changes from today's placement" in page and "Diff against today" in page
    PlacementPlan.objects.filter(pk=row.pk).update(applied_at=timezone.now())
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "today" not in page
    assert "changed by this plan (applied)" in page and "What applying it changed" in page


def test_job_progress_bars_have_an_accessible_name(viewer_client: Client) -> None:
    job = Job.objects.create(kind="noop", status=JobStatus.RUNNING, progress=0.5)
    for url in ("/jobs/", f"/jobs/{job.pk}/"):
        page = viewer_client.get(url).content.decode()
        assert re.findall(r"<progress [^>]*>", page) == [
            f'<progress max="1" value="0.5" aria-label="progress of job {job.pk}">'
        ], url


def test_each_gpu_card_lists_the_deployments_placed_on_it(host: Host, served_model: Any) -> None:
    d0, d1 = Device.objects.filter(host=host).order_by("index")
    wide = Deployment.objects.create(model=served_model, host=host, observed_state="running")
    wide.devices.set([d0, d1])
    stopped = Deployment.objects.create(
        model=served_model, host=host, desired_state="stopped", observed_state="stopped"
    )
    stopped.devices.set([d1])
    cards = {c["index"]: c["deployments"] for k, c in snapshots.overview().items() if k.startswith("device:")}
    running = {
        "id": wide.pk,
        "model_id": served_model.pk,
        "model": served_model.name,
        "desired": "running",
        "observed": "running",
    }
    assert cards[0] == [running]
    assert cards[1] == [running, {**running, "id": stopped.pk, "desired": "stopped", "observed": "stopped"}]
    stopped.delete()
    wide.delete()
    assert all(c["deployments"] == [] for k, c in snapshots.overview().items() if k.startswith("device:"))
