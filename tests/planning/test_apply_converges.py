"""Applying a plan reaches a connected agent: its link re-sends the desired deployments at once."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import Role, User
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from inventory.models import Device
from inventory.services import issue_agent_token, register_host
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from planning.applying import apply_plan

from config.asgi import application
from tests.planning.helpers import GIB, make_model, store_profile

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


def register(host: str) -> dict[str, Any]:
    devices = [
        {
            "index": i,
            "uuid": f"GPU-{host}-{i}",
            "name": "NVIDIA H100",
            "kind": "gpu",
            "memory_total_bytes": 80 * GIB,
            "nvlink_peers": [1 - i],
        }
        for i in range(2)
    ]
    return {
        "v": 1,
        "type": "register",
        "host": host,
        "address": "127.0.0.1",
        "agent_version": "test",
        "simulated": False,
        "devices": devices,
    }


@database_sync_to_async
def plan_for_two_models() -> Job:
    for name, role in (("prod", "producer"), ("cons", "consumer")):
        store_profile(make_model(name), role, 4 * GIB)
    job = Job.objects.create(
        kind="place", params={"solver": "cp-sat", "time_limit_s": 10.0, "burst_level": 4.0}
    )
    run_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    return job


async def test_an_applied_plan_reaches_the_hosts_agent_as_its_desired_deployments() -> None:
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        host = await database_sync_to_async(register_host)("gpu-a", "127.0.0.1")
        token = (await database_sync_to_async(issue_agent_token)(host)).plaintext
        comm = WebsocketCommunicator(
            application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())]
        )
        assert (await comm.connect())[0]
        await comm.send_json_to(register("gpu-a"))
        assert (await comm.receive_json_from(timeout=5))["deployments"] == []
        assert await database_sync_to_async(Device.objects.filter(host=host).count)() == 2

        job = await plan_for_two_models()
        admin = await database_sync_to_async(User.objects.create_user)(
            "root", password="pw-93jd", role=Role.ADMIN
        )
        outcome = await database_sync_to_async(apply_plan)(job, admin)
        assert outcome.applied
        # not the 60 s poll: the deployment writes' commit hook tells the link at once
        desired = None
        while desired is None or len(desired["deployments"]) < 2:
            desired = await comm.receive_json_from(timeout=5)
        placed = {d["model"]["name"]: d["devices"] for d in desired["deployments"]}
        assert sorted(placed) == ["cons", "prod"] and sorted(placed["cons"] + placed["prod"]) == [0, 1]
        await comm.disconnect()
