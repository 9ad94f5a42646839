"""A deployment made while a place job reads the GPUs it may use makes the plan stale: Apply refuses
it as computed on other deployments, not with a device conflict found half way through applying.
The fingerprint used to be taken after the free GPUs were read, so it already included the new
deployment and the plan looked current."""

from __future__ import annotations

from typing import Any

import pytest
from inventory.models import Host
from planning import placing
from planning.models import PlacementPlan
from registry.models import ServedModel
from rest_framework.test import APIClient

from tests.planning.helpers import deploy, deployment_rows, make_model, result_of, run_job_via_api
from tests.planning.test_audit_apply import cluster  # noqa: F401 (a fixture: host-a runs p10 and p6)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cluster")]


def test_a_deployment_made_while_the_free_gpus_are_read_makes_the_plan_stale(
    admin_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = placing.gpus_by_host

    def read_then_deploy(*args: Any, **kwargs: Any) -> Any:
        free = read(*args, **kwargs)
        if not ServedModel.objects.filter(name="other").exists():  # once: an operator's deploy
            deploy(make_model("other", tp=2), Host.objects.get(name="host-b"), 0, 1)
        return free

    monkeypatch.setattr(placing, "gpus_by_host", read_then_deploy)
    job = run_job_via_api(admin_client, "place", {"models": ["c6"]})
    assert [(m["kind"], m["to_server"]) for m in result_of(job)["moves"]] == [("start", "host-b")]
    before = deployment_rows()
    response = admin_client.post(f"/api/v1/plans/{job.pk}/apply/")
    assert response.status_code == 409, response.content
    assert response.data["detail"].startswith("The deployments changed since this plan was computed")
    assert deployment_rows() == before
    assert PlacementPlan.objects.get(job=job).applied_at is None
