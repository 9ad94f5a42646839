"""Desired vs observed state across the agent link: late and re-sent statuses, deleted deployments,
hosts that go offline and come back, device edits while the old engine runs, and agents that
restart with other devices or without the engines they ran."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from agents import services
from agents.models import Replica
from agents.tasks import sweep_liveness
from channels.db import database_sync_to_async
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import create_deployment, update_deployment
from django.test import override_settings
from django.utils import timezone
from gateway.services import healthy_targets
from inventory.models import Device, Host, HostStatus
from inventory.services import register_host
from registry.models import ServedModel

from gpu_agent.protocol import DeploymentStatus, Register, parse_frame

from .conftest import AgentHost, register_frame
from .test_agent_consumer import NO_SWEEP, communicator

pytestmark = pytest.mark.django_db(transaction=True)


def register(host: Host, frame: dict[str, Any] | None = None) -> services.LinkedHost:
    parsed = parse_frame(frame or register_frame(host.name), sender="agent")
    assert isinstance(parsed, Register)
    return services.register(host, parsed)


def status(deployment: Deployment, state: str, ts: float, port: int | None = None) -> DeploymentStatus:
    return DeploymentStatus(str(deployment.pk), state, ts, port=port)  # type: ignore[arg-type]


def deploy(model: ServedModel, host: Host, *indices: int, desired: str = DesiredState.RUNNING) -> Deployment:
    return create_deployment(model, host, [Device.objects.get(host=host, index=i) for i in indices], desired)


def observed(deployment: Deployment) -> str:
    deployment.refresh_from_db()
    return deployment.observed_state


def devices_of(deployment: Deployment) -> list[int]:
    return sorted(deployment.devices.values_list("index", flat=True))


def go_silent(host: Host, seconds: float = 60.0) -> None:
    Host.objects.filter(pk=host.pk).update(last_seen_at=timezone.now() - timedelta(seconds=seconds))


# ---- statuses out of order, for deployments that are gone or elsewhere -------------------------


def test_it_keeps_the_newest_status_when_an_older_one_arrives_late(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    linked = register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0)
    now = time.time()
    services.report_status(linked, status(deployment, "running", now, port=8100))
    # The `starting` sent before it, delivered late (another connection of the host, a held frame).
    services.report_status(linked, status(deployment, "starting", now - 5, port=8100))
    assert observed(deployment) == ObservedState.RUNNING
    replica = Replica.objects.get(deployment=deployment)
    assert (replica.state, replica.base_url) == ("running", "http://10.0.0.5:8100")
    assert [t.deployment_id for t in healthy_targets(served_model)] == [deployment.pk]
    # The same status again (an agent re-sends every status after a reconnect) is taken as it is.
    services.report_status(linked, status(deployment, "failed", now + 1))
    services.report_status(linked, status(deployment, "failed", now + 1))
    assert observed(deployment) == ObservedState.FAILED


def test_a_status_for_a_deleted_or_another_hosts_deployment_writes_nothing(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    linked = register(agent_host.host)
    other = register_host("gpu-b", "10.0.0.6")
    register(other)
    elsewhere = deploy(served_model, other, 0)
    gone = deploy(served_model, agent_host.host, 0)
    gone.delete()
    for deployment in (elsewhere, gone):
        with pytest.raises(services.UnknownDeployment):
            services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    assert not Replica.objects.exists()
    assert Deployment.objects.get().observed_state == ObservedState.PENDING


# ---- device edits while the old engine runs -------------------------------------------------------


def test_an_edit_of_the_devices_is_not_running_until_the_agent_restarts_the_engine(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    linked = register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0)
    services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    update_deployment(deployment, devices=[Device.objects.get(host=agent_host.host, index=1)])
    assert observed(deployment) == ObservedState.PENDING
    assert healthy_targets(served_model) == []
    # The old engine's `running`, re-sent after a reconnect or in flight, is not the new spec's.
    services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    assert observed(deployment) == ObservedState.PENDING
    assert services.desired_deployments(linked).deployments[0].devices == [1]
    # The agent stops the old engine and starts the new one.
    for state, port in (("stopped", None), ("starting", 8101), ("running", 8101)):
        services.report_status(linked, status(deployment, state, time.time(), port=port))
        assert observed(deployment) == state
    assert Replica.objects.get(deployment=deployment).base_url == "http://10.0.0.5:8101"


def test_an_edit_undone_before_the_agent_acted_leaves_the_old_engine_running(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """The agent restarts only an engine whose spec changed: back to the old devices, nothing will
    report, so the old engine's state must come back."""
    linked = register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0)
    services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    d0, d1 = Device.objects.filter(host=agent_host.host).order_by("index")
    update_deployment(deployment, devices=[d1])
    update_deployment(deployment, devices=[d0])
    assert observed(deployment) == ObservedState.RUNNING
    assert [t.deployment_id for t in healthy_targets(served_model)] == [deployment.pk]


def test_an_edit_from_a_stale_copy_does_not_overwrite_what_the_agent_reported(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    linked = register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0)
    stale = Deployment.objects.get(pk=deployment.pk)  # e.g. loaded by a request or a plan apply
    services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    update_deployment(stale, desired_state=DesiredState.RUNNING)
    assert observed(deployment) == ObservedState.RUNNING


# ---- hosts going offline and coming back ---------------------------------------------------------


@override_settings(HOST_STALE_AFTER_S=2.5, HOST_OFFLINE_AFTER_S=30.0)
def test_an_offline_hosts_deployments_are_not_shown_running_and_come_back_with_it(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    linked = register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0)
    services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    go_silent(agent_host.host)
    sweep_liveness()
    assert Host.objects.get().status == HostStatus.OFFLINE
    deployment.refresh_from_db()
    assert deployment.observed_state == ObservedState.UNKNOWN and not deployment.converged
    assert healthy_targets(served_model) == []
    # The agent's heartbeats resume on the same connection (it was hung, not restarted): nothing
    # re-sends the statuses, so the last report stands again.
    services.heartbeat(agent_host.host.pk)
    sweep_liveness()
    assert observed(deployment) == ObservedState.RUNNING
    assert [t.deployment_id for t in healthy_targets(served_model)] == [deployment.pk]


@override_settings(HOST_STALE_AFTER_S=2.5, HOST_OFFLINE_AFTER_S=30.0)
def test_a_stop_ordered_while_the_agent_was_down_converges_when_a_restarted_agent_registers(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    linked = register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0)
    services.report_status(linked, status(deployment, "running", time.time(), port=8100))
    go_silent(agent_host.host)
    sweep_liveness()
    update_deployment(deployment, desired_state=DesiredState.STOPPED)
    # A restarted agent runs nothing and so reports nothing about the deployment.
    linked = register(agent_host.host)
    assert services.desired_deployments(linked).deployments == []
    deployment.refresh_from_db()
    assert deployment.observed_state == ObservedState.STOPPED and deployment.converged


def test_a_deployment_the_agent_never_runs_is_stopped_not_pending(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """Created stopped, or stopped after the agent refused it (a device it lacks): the agent has
    nothing to stop and reports nothing, so the stop is observed at once."""
    linked = register(agent_host.host)
    created_stopped = deploy(served_model, agent_host.host, 0, desired=DesiredState.STOPPED)
    assert observed(created_stopped) == ObservedState.STOPPED
    refused = deploy(served_model, agent_host.host, 1)
    services.report_status(linked, status(refused, "failed", time.time()))
    update_deployment(refused, desired_state=DesiredState.STOPPED)
    refused.refresh_from_db()
    assert refused.observed_state == ObservedState.STOPPED and refused.converged


# ---- agents registering other devices -------------------------------------------------------------


def test_an_agent_whose_gpus_moved_to_other_indices_can_register(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    host = agent_host.host
    register(host, register_frame(gpus=3))
    deployment = deploy(served_model, host, 2)
    # Restarted without GPU 1: the driver numbers the remaining ones 0 and 1.
    frame = register_frame(gpus=2)
    frame["devices"][1]["uuid"] = "GPU-gpu-a-2"
    linked = register(host, frame)
    uuids = dict(Device.objects.filter(host=host).values_list("index", "uuid"))
    assert (uuids[0], uuids[1]) == ("GPU-gpu-a-0", "GPU-gpu-a-2")
    assert uuids[2] != "GPU-gpu-a-2"  # kept for the deployment, which the agent will report failed
    assert services.desired_deployments(linked).deployments[0].devices == [2]
    assert devices_of(deployment) == [2]
    # Two GPUs swapped places.
    frame["devices"][0]["uuid"], frame["devices"][1]["uuid"] = "GPU-gpu-a-2", "GPU-gpu-a-0"
    register(host, frame)
    uuids = dict(Device.objects.filter(host=host).values_list("index", "uuid"))
    assert (uuids[0], uuids[1]) == ("GPU-gpu-a-2", "GPU-gpu-a-0")


# ---- the same over the websocket -------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_reconnecting_agent_gets_the_edit_and_its_old_engine_is_not_taken_for_it(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """Changed while the agent was away: the register handshake delivers the new devices, and the
    statuses the agent re-sends after `register` (its old engine's) do not claim them running."""
    host = agent_host.host
    await database_sync_to_async(register)(host)
    deployment = await database_sync_to_async(deploy)(served_model, host, 0)
    linked = await database_sync_to_async(register)(host)
    await database_sync_to_async(services.report_status)(
        linked, status(deployment, "running", time.time(), port=8100)
    )
    device1 = await database_sync_to_async(Device.objects.get)(host=host, index=1)
    await database_sync_to_async(update_deployment)(deployment, devices=[device1])
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        hello = status(deployment, "running", time.time(), port=8100).to_dict()
        await comm.send_json_to(hello)
        desired = await comm.receive_json_from(timeout=5)
        assert [d["devices"] for d in desired["deployments"]] == [[1]]
        assert await comm.receive_nothing(timeout=0.3)
        assert await database_sync_to_async(observed)(deployment) == ObservedState.PENDING
        await comm.disconnect()
