"""The place job end to end: plan stored with its diff, applied by an admin with the fewest moves,
idempotent, stale plans refused, viewers and anonymous callers refused, bad input fails cleanly."""

from __future__ import annotations

import pytest
from deployments.models import Deployment, DesiredState
from inventory.models import Device, DeviceKind, Host
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.models import PlacementPlan
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

pytestmark = pytest.mark.django_db


def apply_url(job_id: int) -> str:
    return f"/api/v1/plans/{job_id}/apply/"


@pytest.fixture
def cluster(two_hosts: tuple[Host, Host]) -> dict[str, int]:
    """Two 2-GPU NVLink hosts; producers p10, p6 and consumers c10, c6 (GiB lent / needed at 4x).
    Both producers run on host-a now; the consumers are not deployed."""
    host_a, _ = two_hosts
    sizes = {"p10": ("producer", 10), "p6": ("producer", 6), "c10": ("consumer", 10), "c6": ("consumer", 6)}
    models = {name: make_model(name) for name in sizes}
    for name, (role, gib) in sizes.items():
        store_profile(models[name], role, gib * GIB)
    deploy(models["p10"], host_a, 0)
    deploy(models["p6"], host_a, 1)
    return {name: gib for name, (_, gib) in sizes.items()}


def test_it_stores_the_optimal_plan_and_its_fewest_moves_diff(admin_client: APIClient, cluster: dict) -> None:
    job = run_job_via_api(admin_client, "place", {"time_limit_s": 10})
    assert job.status == JobStatus.SUCCEEDED, job.error
    plan = result_of(job)["plan"]
    # known optimum: each host holds one producer and the consumer it covers exactly -> objective 0
    assert plan["objective"] == 0 and plan["status"] == "optimal"
    pairs = {(p["lender"], p["borrower"]) for p in plan["pairings"]}
    assert pairs == {("p10", "c10"), ("p6", "c6")} and plan["dram_fallbacks"] == []
    servers = {a["model"]: a["server"] for a in plan["assignments"]}
    assert servers["p10"] == servers["c10"] != servers["p6"] == servers["c6"]
    # fewest moves: one producer stays on host-a (on its GPU), the other moves, both consumers start
    kinds = sorted(m["kind"] for m in result_of(job)["moves"])
    assert kinds == ["move", "start", "start"]
    stays = {"p10", "p6"} - {m["model"] for m in result_of(job)["moves"]}
    assert len(stays) == 1 and servers[stays.pop()] == "host-a"
    stored = PlacementPlan.objects.get(job=job)
    assert stored.plan == plan and stored.moves == result_of(job)["moves"] and stored.applied_at is None
    assert placement() == {"p10": ("host-a", [0]), "p6": ("host-a", [1])}  # nothing applied yet


def test_it_applies_a_plan_for_admins_only_and_idempotently(
    admin_client: APIClient, viewer_client: APIClient, anon_client: APIClient, cluster: dict
) -> None:
    job = run_job_via_api(admin_client, "place", {})
    before = deployment_rows()
    assert viewer_client.post(apply_url(job.pk)).status_code == 403
    assert anon_client.post(apply_url(job.pk)).status_code == 401
    assert deployment_rows() == before

    response = admin_client.post(apply_url(job.pk))
    assert response.status_code == 200, response.data
    assert response.data["applied"] is True and len(response.data["moves"]) == 3
    planned = {a["model"]: (a["server"], a["gpus"]) for a in result_of(job)["plan"]["assignments"]}
    assert placement() == {m: (s, sorted(g)) for m, (s, g) in planned.items()}
    # the producer that moved left a stopped deployment behind on host-a
    moved = next(m["model"] for m in result_of(job)["moves"] if m["kind"] == "move")
    assert (
        Deployment.objects.filter(model__name=moved, host__name="host-a", desired_state="stopped").count()
        == 1
    )
    stored = PlacementPlan.objects.get(job=job)
    assert stored.applied_at is not None and stored.applied_by is not None

    after = deployment_rows()
    again = admin_client.post(apply_url(job.pk))
    assert again.status_code == 200 and again.data["applied"] is False and again.data["moves"] == []
    assert deployment_rows() == after


def test_it_refuses_a_stale_plan_with_409_and_changes_nothing(admin_client: APIClient, cluster: dict) -> None:
    job = run_job_via_api(admin_client, "place", {})
    p6 = Deployment.objects.get(model__name="p6")
    p6.desired_state = DesiredState.STOPPED  # an operator edit after the plan was computed
    p6.save()
    before = deployment_rows()
    response = admin_client.post(apply_url(job.pk))
    assert response.status_code == 409
    assert "changed since this plan was computed" in response.data["detail"]
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=job).applied_at is None


def test_it_answers_404_for_a_job_that_is_not_a_succeeded_place_job(
    admin_client: APIClient, cluster: dict
) -> None:
    noop = run_job_via_api(admin_client, "noop", {"steps": 1, "delay_s": 0.0})
    assert admin_client.post(apply_url(noop.pk)).status_code == 404
    assert admin_client.post(apply_url(999_999)).status_code == 404


def test_it_lists_plans_and_profiles_to_viewers(
    admin_client: APIClient, viewer_client: APIClient, anon_client: APIClient, cluster: dict
) -> None:
    job = run_job_via_api(admin_client, "place", {})
    plan = viewer_client.get(f"/api/v1/plans/{job.pk}/")
    assert plan.status_code == 200 and plan.data["moves"] == result_of(job)["moves"]
    profiles = viewer_client.get("/api/v1/profiles/")
    assert profiles.status_code == 200
    assert [p["model"] for p in profiles.data["results"]] == ["c10", "c6", "p10", "p6"]
    assert viewer_client.get("/api/v1/profiles/c10/").data["swap_needed_bytes"]["4x"] == 10 * GIB
    assert anon_client.get("/api/v1/plans/").status_code == 401


def test_it_moves_gpus_on_the_same_host_and_frees_devices_before_taking_them(
    admin_client: APIClient, db: None
) -> None:
    # One 2-GPU host: a producer and a consumer swap GPUs only if the plan says so; either way the
    # apply must never fail on a device that the same apply frees.
    host = make_host("solo")
    p, c = make_model("p"), make_model("c")
    store_profile(p, "producer", 4 * GIB)
    store_profile(c, "consumer", 4 * GIB)
    deploy(c, host, 0)
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert [m["kind"] for m in result_of(job)["moves"]] == ["start"]  # c keeps GPU 0, p starts on GPU 1
    assert admin_client.post(apply_url(job.pk)).status_code == 200
    assert placement() == {"c": ("solo", [0]), "p": ("solo", [1])}


def test_every_model_means_every_profiled_one_the_others_are_left_alone_and_listed(
    admin_client: APIClient, cluster: dict
) -> None:
    # make run's tiny model is never profiled: a plan of "every model" places the profiled ones,
    # keeps the GPU the unprofiled one runs on out of the plan, and says which it left out.
    deploy(make_model("tiny"), make_host("host-c"), 1)
    make_model("idle")  # registered, not deployed, not profiled
    job = run_job_via_api(admin_client, "place", {})
    assert job.status == JobStatus.SUCCEEDED, job.error
    result = result_of(job)
    assert result["left_out"] == ["idle", "tiny"]
    planned = {a["model"] for a in result["plan"]["assignments"]}
    assert planned == {"p10", "p6", "c10", "c6"}
    assert ("host-c", 1) not in {(a["server"], g) for a in result["plan"]["assignments"] for g in a["gpus"]}
    assert all(m["model"] not in ("tiny", "idle") for m in result["moves"])
    assert admin_client.post(apply_url(job.pk)).status_code == 200
    assert placement()["tiny"] == ("host-c", [1])  # left where it runs


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("named_profile_deleted_after_post", "models without a profile: c6"),
        ("none_profiled", "no model has a profile yet (run a profile job for each: c10, c6, p10, p6)"),
        ("infeasible", "need more GPUs than any server has"),
        ("slo_changed", "profile it again"),
        ("level_not_profiled", "burst level 4x was not profiled (have 8x)"),
        ("no_hosts", "no hosts with GPU devices"),
    ],
)
def test_it_fails_bad_input_with_a_clear_error_and_applies_nothing(
    admin_client: APIClient, cluster: dict, setup: str, needle: str
) -> None:
    from registry.models import ServedModel

    params: dict = {}
    if setup == "named_profile_deleted_after_post":
        # refused at POST (below); a profile deleted between the POST and the run fails the run
        params = {"models": ["c6", "p6"]}
    elif setup == "none_profiled":
        for model in ServedModel.objects.all():
            model.profile.delete()
    elif setup == "infeasible":
        big = make_model("big", tp=4)
        store_profile(big, "producer", GIB)
    elif setup == "slo_changed":
        ServedModel.objects.filter(name="p6").update(slo_ttft_p99_ms=100.0)
    elif setup == "no_hosts":
        Device.objects.filter(deployments__isnull=True).delete()
        Device.objects.update(kind=DeviceKind.CPU)
    else:
        profile = ServedModel.objects.get(name="c6").profile
        profile.data = {**profile.data, "swap_needed_bytes": {"8x": 12 * GIB}}
        profile.save()
    before = deployment_rows()
    posted = admin_client.post("/api/v1/jobs/", {"kind": "place", "params": params}, format="json")
    assert posted.status_code == 201, posted.data
    if setup == "named_profile_deleted_after_post":
        ServedModel.objects.get(name="c6").profile.delete()
    run_job(posted.data["id"])
    job = Job.objects.get(pk=posted.data["id"])
    assert job.status == JobStatus.FAILED
    assert needle in job.error
    assert job.result is None and not PlacementPlan.objects.filter(job=job).exists()
    assert deployment_rows() == before


def test_an_empty_model_selection_is_refused_not_taken_as_every_model(
    admin_client: APIClient, viewer_client: APIClient, cluster: dict
) -> None:
    from jobs.models import Job

    refused = admin_client.post("/api/v1/jobs/", {"kind": "place", "params": {"models": []}}, format="json")
    assert refused.status_code == 400
    assert "may not be empty" in str(refused.data["params"]["models"])
    assert not Job.objects.exists()
    body = {"kind": "place", "params": {}}
    assert viewer_client.post("/api/v1/jobs/", body, format="json").status_code == 403
    # a job stored with an empty selection (by an older version) places nothing either
    before = deployment_rows()
    stored = Job.objects.create(kind="place", params={"models": []})
    run_job(stored.pk)
    stored.refresh_from_db()
    assert stored.status == JobStatus.FAILED and "no registered models to place" in stored.error
    assert not PlacementPlan.objects.exists() and deployment_rows() == before
    # leaving the key out still places every model
    every = run_job_via_api(admin_client, "place", {})
    assert every.status == JobStatus.SUCCEEDED, every.error
    assert {a["model"] for a in result_of(every)["plan"]["assignments"]} == set(cluster)


def test_it_neither_lists_nor_shows_the_plan_of_a_job_that_did_not_succeed(
    admin_client: APIClient, viewer_client: APIClient, cluster: dict
) -> None:
    kept = run_job_via_api(admin_client, "place", {})
    dropped = run_job_via_api(admin_client, "place", {"solver": "greedy"})
    # Stored while it ran, then cancelled (or failed, or lost with its worker) before it ended.
    Job.objects.filter(pk=dropped.pk).update(status=JobStatus.CANCELLED)
    listed = viewer_client.get("/api/v1/plans/")
    assert listed.status_code == 200
    assert [p["job"] for p in listed.data["results"]] == [kept.pk]
    assert viewer_client.get(f"/api/v1/plans/{dropped.pk}/").status_code == 404
    assert viewer_client.get(f"/api/v1/plans/{kept.pk}/").status_code == 200
    assert admin_client.post(apply_url(dropped.pk)).status_code == 404


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([f"m{i}" for i in range(70_000)], "Ensure this field has no more than 1000 elements."),
        (["x" * 101], "Ensure this field has no more than 100 characters."),
    ],
    ids=["too-many-names", "name-too-long"],
)
def test_an_oversized_model_selection_is_a_400_naming_the_field(
    admin_client: APIClient, cluster: dict, models: list[str], message: str
) -> None:
    # 70,000 names were looked up in one query and the 400 named every one of them (700 kB).
    body = {"kind": "place", "params": {"models": models}}
    refused = admin_client.post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 400, refused.content[:300]
    assert message in str(refused.data["params"]["models"])
    assert not Job.objects.exists()


def test_a_refusal_of_unknown_models_names_ten_of_them(admin_client: APIClient, cluster: dict) -> None:
    models = ["c6", *(f"gone-{i:02d}" for i in range(25))]
    body = {"kind": "place", "params": {"models": models}}
    refused = admin_client.post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 400
    named = ", ".join(f"'gone-{i:02d}'" for i in range(10))
    assert refused.data["params"]["models"] == [f"No served model named {named} and 15 more."]


def test_a_named_model_without_a_profile_is_a_400_at_post_naming_it(
    admin_client: APIClient, cluster: dict
) -> None:
    # It was stored (201) and failed when it ran with "models without a profile: n6".
    make_model("n6")
    make_model("n7")
    body = {"kind": "place", "params": {"models": ["c6", "n7", "n6"]}}
    refused = admin_client.post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 400, refused.data
    assert refused.data["params"]["models"] == [
        "No profile for 'n6', 'n7'; run a profile job for each, then place."
    ]
    assert not Job.objects.exists()
    assert (
        admin_client.post(
            "/api/v1/jobs/", {"kind": "place", "params": {"models": ["c6"]}}, format="json"
        ).status_code
        == 201
    )
