"""Placing and applying, audited: a plan whose model, host or GPU is gone is refused with a 409
naming it and changes nothing; a plan over some models leaves the GPUs of the others alone; a model
may be planned onto a host of another size; two applies at once run one after the other."""

from __future__ import annotations

import contextlib
import copy
import threading

import pytest
from deployments.models import Deployment, DesiredState
from django.db import connection
from inventory.models import Device, Host
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning import applying
from planning.applying import PlanConflict, apply_plan
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


def apply_url(job_id: int) -> str:
    return f"/api/v1/plans/{job_id}/apply/"


@pytest.fixture
def cluster(two_hosts: tuple[Host, Host]) -> None:
    """As in test_place_job: producers p10 and p6 run on host-a; consumers c10 and c6 do not run."""
    host_a, _ = two_hosts
    sizes = {"p10": ("producer", 10), "p6": ("producer", 6), "c10": ("consumer", 10), "c6": ("consumer", 6)}
    for name, (role, gib) in sizes.items():
        store_profile(make_model(name), role, gib * GIB)
    deploy(ServedModel.objects.get(name="p10"), host_a, 0)
    deploy(ServedModel.objects.get(name="p6"), host_a, 1)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("model_deleted", "model 'c6'"),
        ("host_deleted", "host 'host-b'"),
        ("gpu_removed", "GPU 0 of host 'host-b'"),
    ],
)
def test_it_refuses_a_plan_whose_model_host_or_gpu_is_gone_and_changes_nothing(
    admin_client: APIClient, cluster: None, change: str, needle: str
) -> None:
    job = run_job_via_api(admin_client, "place", {})
    starts = {m["model"]: m for m in result_of(job)["moves"] if m["kind"] == "start"}
    assert starts["c6"]["to_server"] == "host-b" and starts["c6"]["to_gpus"] == [0]
    if change == "model_deleted":
        ServedModel.objects.filter(name="c6").delete()  # allowed: it has no deployment
    elif change == "host_deleted":
        Host.objects.filter(name="host-b").delete()  # allowed: nothing is deployed there
    else:
        Device.objects.filter(host__name="host-b", index=0).delete()
    before = deployment_rows()
    response = admin_client.post(apply_url(job.pk))
    assert response.status_code == 409, response.content
    assert needle in response.data["detail"] and "run a new place job" in response.data["detail"]
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=job).applied_at is None


@pytest.mark.django_db
def test_a_change_refused_half_way_undoes_the_changes_made_before_it(
    admin_client: APIClient, cluster: None
) -> None:
    job = run_job_via_api(admin_client, "place", {})
    # c6 now needs 2 GPUs (it has no running deployment, so its TP may change): the apply stops and
    # moves producers first, then fails starting c6; the stops must not stay behind.
    ServedModel.objects.filter(name="c6").update(tensor_parallel_size=2)
    before = deployment_rows()
    response = admin_client.post(apply_url(job.pk))
    assert response.status_code == 409
    assert "Model c6 needs 2 device(s)" in response.data["detail"]
    assert deployment_rows() == before


@pytest.mark.django_db
def test_a_plan_of_some_models_leaves_the_gpus_of_the_others_alone(
    admin_client: APIClient, cluster: None
) -> None:
    # p10 runs on host-a GPU 0 and is not in the plan: the placer must not count that GPU as free
    job = run_job_via_api(admin_client, "place", {"models": ["p6", "c10", "c6"]})
    assert job.status == JobStatus.SUCCEEDED, job.error
    planned = {a["model"]: (a["server"], a["gpus"]) for a in result_of(job)["plan"]["assignments"]}
    assert ("host-a", [0]) not in planned.values()
    # the stored plan lists each host whole, with device indices
    assert {s["name"]: s["num_gpus"] for s in result_of(job)["plan"]["servers"]} == {"host-a": 2, "host-b": 2}

    response = admin_client.post(apply_url(job.pk))
    assert response.status_code == 200, response.data
    assert placement() == {"p10": ("host-a", [0]), **{m: (s, sorted(g)) for m, (s, g) in planned.items()}}


@pytest.mark.django_db
def test_a_plan_of_some_models_fails_clearly_when_the_others_hold_every_gpu(
    admin_client: APIClient, cluster: None
) -> None:
    host_b = Host.objects.get(name="host-b")
    deploy(ServedModel.objects.get(name="c10"), host_b, 0)
    deploy(ServedModel.objects.get(name="c6"), host_b, 1)
    job = run_job_via_api(admin_client, "place", {"models": ["c6"]})
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert result_of(job)["moves"] == []  # its own GPU is the only one it may use

    store_profile(make_model("x"), "producer", GIB)
    before = deployment_rows()
    job = run_job_via_api(admin_client, "place", {"models": ["x"]})
    assert job.status == JobStatus.FAILED
    assert "no hosts with GPU devices not used by models outside the plan" in job.error
    assert not PlacementPlan.objects.filter(job=job).exists() and deployment_rows() == before


@pytest.mark.django_db
def test_it_plans_a_model_away_from_a_host_of_another_size(admin_client: APIClient) -> None:
    # p runs on the 1-GPU host; pairing it with c needs one NVLink server with 2 GPUs
    small = make_host("small", gpus=1)
    make_host("big", gpus=2)
    p, c = make_model("p"), make_model("c")
    store_profile(p, "producer", 4 * GIB)
    store_profile(c, "consumer", 4 * GIB)
    deploy(p, small, 0)
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert sorted((m["model"], m["kind"]) for m in result_of(job)["moves"]) == [("c", "start"), ("p", "move")]
    assert admin_client.post(apply_url(job.pk)).status_code == 200
    assert {model: host for model, (host, _) in placement().items()} == {"c": "big", "p": "big"}


def _copy_plan_to(job: Job, host: str) -> Job:
    """A second succeeded place job whose plan puts every model on `host` instead."""
    other = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, params=job.params)
    stored = PlacementPlan.objects.get(job=job)
    plan = copy.deepcopy(stored.plan)
    for a in plan["assignments"]:
        a["server"] = host
    PlacementPlan.objects.create(job=other, plan=plan, moves=[], fingerprint=stored.fingerprint)
    return other


@pytest.mark.django_db(transaction=True)
def test_two_applies_at_once_run_one_after_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two plans computed on the same deployments start model m on different hosts. Each apply
    # waits (up to 1 s) after its staleness check for the other to have checked too: without a
    # lock taken before that check both see the deployments unchanged and m runs twice. (SQLite's
    # IMMEDIATE transactions serialise the two anyway; PostgreSQL needs the host row locks.)
    make_host("host-a"), make_host("host-b")
    store_profile(make_model("m"), "producer", 4 * GIB)
    first = Job.objects.create(kind="place", params={"solver": "greedy"})
    run_job(first.pk)
    first.refresh_from_db()
    assert first.status == JobStatus.SUCCEEDED, first.error
    server = result_of(first)["plan"]["assignments"][0]["server"]
    second = _copy_plan_to(first, "host-b" if server == "host-a" else "host-a")

    both_checked = threading.Barrier(2)
    fingerprint = applying.fingerprint

    def slow_fingerprint() -> str:
        value = fingerprint()
        with contextlib.suppress(threading.BrokenBarrierError):
            both_checked.wait(timeout=1.0)
        return value

    monkeypatch.setattr(applying, "fingerprint", slow_fingerprint)
    outcomes: list[str] = []

    def apply(job: Job) -> None:
        try:
            apply_plan(job, None)
            outcomes.append("applied")
        except PlanConflict as exc:
            outcomes.append("conflict" if "changed since" in str(exc) else str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=apply, args=(job,)) for job in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["applied", "conflict"]
    assert Deployment.objects.filter(model__name="m", desired_state=DesiredState.RUNNING).count() == 1
