"""Statuses across agent runs: the agent's clock orders statuses within one run (one registration),
not across runs, since a restarted agent's clock may be behind the stored status's (stepped back, an
NTP correction, a replacement machine); a late status of an older run never stands."""

from __future__ import annotations

import functools
import time

import pytest
from agents import services
from agents.models import Replica
from channels.db import database_sync_to_async
from deployments.models import Deployment, ObservedState
from gateway.services import healthy_targets
from registry.models import ServedModel

from .conftest import AgentHost, register_frame
from .test_agent_consumer import NO_SWEEP, communicator, until
from .test_reconcile_audit import deploy, observed, register, status

pytestmark = pytest.mark.django_db(transaction=True)


def stored(deployment: Deployment, state: str) -> bool:
    return observed(deployment) == state


HOUR = 3600.0


def test_it_takes_the_statuses_of_a_restarted_agent_whose_clock_is_behind(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    host = agent_host.host
    before = register(host)
    deployment = deploy(served_model, host, 0)
    now = time.time()
    services.report_status(before, status(deployment, "running", now, port=8100))
    # Restarted on a clock an hour behind: its engine starts again on another port.
    after = register(host)
    services.report_status(after, status(deployment, "starting", now - HOUR, port=8101))
    assert observed(deployment) == ObservedState.STARTING
    assert healthy_targets(served_model) == []
    services.report_status(after, status(deployment, "running", now - HOUR + 5, port=8101))
    assert observed(deployment) == ObservedState.RUNNING
    replica = Replica.objects.get(deployment=deployment)
    assert (replica.state, replica.base_url) == ("running", "http://10.0.0.5:8101")
    assert [t.base_url for t in healthy_targets(served_model)] == ["http://10.0.0.5:8101"]
    # Within the new run, the agent's clock still orders its statuses.
    services.report_status(after, status(deployment, "starting", now - HOUR + 1, port=8101))
    assert observed(deployment) == ObservedState.RUNNING
    # A late status of the previous run, however new its clock says it is, changes nothing.
    assert services.report_status(before, status(deployment, "failed", now + 10)) is None
    assert observed(deployment) == ObservedState.RUNNING
    assert Replica.objects.get(deployment=deployment).base_url == "http://10.0.0.5:8101"


def test_a_late_status_of_a_superseded_connection_is_ignored_before_the_new_run_reports(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """The newer registration re-sends every status; until it does, the stored one stays."""
    host = agent_host.host
    before = register(host)
    deployment = deploy(served_model, host, 0)
    now = time.time()
    services.report_status(before, status(deployment, "running", now, port=8100))
    register(host)
    assert services.report_status(before, status(deployment, "failed", now + 1)) is None
    assert observed(deployment) == ObservedState.RUNNING
    assert Replica.objects.get(deployment=deployment).state == "running"


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_reconnecting_agent_with_a_clock_behind_is_followed_over_the_websocket(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    host = agent_host.host
    await database_sync_to_async(register)(host)
    deployment = await database_sync_to_async(deploy)(served_model, host, 0)
    now = time.time()
    with NO_SWEEP:
        for ts, state in ((now, "running"), (now - HOUR, "failed")):
            comm = communicator(agent_host.token)
            assert (await comm.connect())[0]
            await comm.send_json_to(register_frame())
            assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
            port = 8100 if state == "running" else None
            await comm.send_json_to(status(deployment, state, ts, port=port).to_dict())
            await until(functools.partial(stored, deployment, state), f"the {state} status stored")
            assert await comm.receive_nothing(timeout=0.3)  # stored, not rejected
            await comm.disconnect()
            assert await database_sync_to_async(observed)(deployment) == state
