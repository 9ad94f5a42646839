"""The agent link's server side, driven through the real ASGI application with WebsocketCommunicator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from agents.models import AgentLink, DeviceSample, EngineSample, Replica
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from deployments.engine_keys import engine_api_key
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import create_deployment
from django.test import override_settings
from inventory.models import Device, DeviceKind, Host, HostStatus
from inventory.services import issue_agent_token
from registry.models import ServedModel

from config.asgi import application

from .conftest import AgentHost, device_sample, register_frame, telemetry_frame

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]
NO_SWEEP = override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0)


def communicator(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


@pytest_asyncio.fixture
async def link(agent_host: AgentHost) -> AsyncIterator[WebsocketCommunicator]:
    """A connected, registered agent link of host gpu-a (2 GPUs); its first desired list consumed."""
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        connected, _ = await comm.connect()
        assert connected
        await comm.send_json_to(register_frame())
        first = await comm.receive_json_from(timeout=5)
        assert first["type"] == "desired_deployments"
        yield comm
        await comm.disconnect()


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Until ``predicate()``, called on the database thread, holds. The consumer handles a frame
    some time after it is sent, and stores telemetry later still (in the writer's group commits, on
    another thread): a fixed wait before reading the database would race them on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while not await database_sync_to_async(predicate)():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.02)


@database_sync_to_async
def deploy(model: ServedModel, host: Host, index: int, desired: str = DesiredState.RUNNING) -> Deployment:
    return create_deployment(model, host, [Device.objects.get(host=host, index=index)], desired)


async def test_it_refuses_a_missing_wrong_or_revoked_token(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        for token in (None, "agt_forged", agent_host.token + "x"):
            connected, _ = await communicator(token).connect()
            assert connected is False, token
        await database_sync_to_async(issue_agent_token)(agent_host.host)  # revokes the fixture's token
        connected, _ = await communicator(agent_host.token).connect()
        assert connected is False


async def test_it_registers_the_host_and_its_devices(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        frame = register_frame(address="10.0.0.9")
        frame["simulated"] = True
        await comm.send_json_to(frame)
        desired = await comm.receive_json_from(timeout=5)
        assert desired == {"v": 1, "type": "desired_deployments", "deployments": []}
        host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
        assert (host.address, host.simulated, host.status) == ("10.0.0.9", True, HostStatus.ONLINE)
        devices = await database_sync_to_async(list)(Device.objects.filter(host=host).order_by("index"))
        assert [(d.index, d.uuid, d.kind, d.nvlink_peers) for d in devices] == [
            (0, "GPU-gpu-a-0", DeviceKind.GPU, [1]),
            (1, "GPU-gpu-a-1", DeviceKind.GPU, [0]),
        ]
        link = await database_sync_to_async(AgentLink.objects.get)(host=host)
        assert link.connected and link.agent_version == "0.1.0"
        await comm.disconnect()
        link = await database_sync_to_async(AgentLink.objects.get)(host=host)
        assert not link.connected and link.disconnected_at is not None


async def test_it_closes_the_link_of_an_agent_registering_as_another_host(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame(host="gpu-b"))
        error = await comm.receive_json_from(timeout=5)
        assert (error["type"], error["code"], error["field"]) == ("error", "unauthorized", "host")
        assert (await comm.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4403}
        assert not await database_sync_to_async(Device.objects.exists)()


async def test_it_sends_the_running_deployments_of_the_host_on_register(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        await comm.receive_json_from(timeout=5)
        running = await deploy(served_model, agent_host.host, 1)
        await deploy(served_model, agent_host.host, 0, DesiredState.STOPPED)
        # The commit's hook tells this connection; a stopped deployment is not in the list.
        desired = await comm.receive_json_from(timeout=5)
        assert desired["deployments"] == [
            {
                "id": str(running.pk),
                "model": {
                    "name": "tiny",
                    "source": "/models/tiny",
                    "dtype": "float32",
                    "tensor_parallel_size": 1,
                    "max_context_len": 256,
                    "engine_options": {"seed": 0},
                },
                "devices": [1],
                "api_key": engine_api_key(running.pk),
            }
        ]
        # The stopped deployment changed nothing the agent must run: no second frame.
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()


async def test_it_pushes_a_changed_desired_list(
    link: WebsocketCommunicator, agent_host: AgentHost, served_model: ServedModel
) -> None:
    deployment = await deploy(served_model, agent_host.host, 0)
    assert [d["id"] for d in (await link.receive_json_from(timeout=5))["deployments"]] == [str(deployment.pk)]

    @database_sync_to_async
    def stop() -> None:
        deployment.desired_state = DesiredState.STOPPED
        deployment.save()

    await stop()
    assert (await link.receive_json_from(timeout=5))["deployments"] == []


async def test_it_polls_for_changes_made_in_other_processes(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=0.2):
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        await comm.receive_json_from(timeout=5)
        deployment = await deploy(served_model, agent_host.host, 0)
        await comm.receive_json_from(timeout=5)  # the hook's push
        # A queryset update sends no signal: what a write in another process looks like here.
        await database_sync_to_async(Deployment.objects.filter(pk=deployment.pk).update)(
            desired_state=DesiredState.STOPPED
        )
        assert (await comm.receive_json_from(timeout=5))["deployments"] == []
        await comm.disconnect()


async def test_it_stores_device_and_engine_samples(
    link: WebsocketCommunicator, agent_host: AgentHost, served_model: ServedModel
) -> None:
    deployment = await deploy(served_model, agent_host.host, 0)
    await link.receive_json_from(timeout=5)
    engine = {
        "deployment_id": str(deployment.pk),
        "state": "running",
        "ttft": {"count": 4, "p50": 0.05, "p99": 0.2},
        "itl": {"count": 40, "p50": 0.01, "p99": 0.03},
        "kv_cache_usage": 0.25,
        "running": 2,
        "waiting": 1,
        "preemptions_total": 3,
        "bytes_offloaded": 4096,
    }
    lending = {"aqua_role": "producer", "lent_bytes": 8 << 30, "paired_with": 1}
    await link.send_json_to(telemetry_frame([device_sample(0, **lending), device_sample(1)], [engine]))
    await link.send_json_to(telemetry_frame([device_sample(0), device_sample(1)]))
    await until(lambda: DeviceSample.objects.count() >= 4, "both frames' samples stored")
    assert await link.receive_nothing(timeout=0.3)  # stored, not answered with an error

    samples = await database_sync_to_async(list)(DeviceSample.objects.order_by("pk").values())
    assert len(samples) == 4
    first = samples[0]
    assert (first["aqua_role"], first["lent_bytes"], first["paired_with"]) == ("producer", 8 << 30, 1)
    assert first["memory_used_bytes"] == 10 << 30 and first["utilization_pct"] == 50.0
    stored = await database_sync_to_async(EngineSample.objects.get)(deployment=deployment)
    assert (stored.ttft_count, stored.ttft_p50, stored.ttft_p99, stored.itl_p99) == (4, 0.05, 0.2, 0.03)
    assert (stored.kv_cache_usage, stored.running, stored.waiting) == (0.25, 2, 1)
    assert (stored.preemptions_total, stored.bytes_offloaded) == (3, 4096)


async def test_it_reports_samples_naming_what_the_host_does_not_have_once(
    link: WebsocketCommunicator,
) -> None:
    for _ in range(2):
        await link.send_json_to(telemetry_frame([device_sample(0), device_sample(7)]))
    error = await link.receive_json_from(timeout=5)
    assert (error["type"], error["code"], error["field"]) == ("error", "unknown_device", "devices")
    await until(lambda: DeviceSample.objects.count() >= 2, "device 0's samples of both frames stored")
    assert await link.receive_nothing(timeout=0.3)  # not again for the second frame
    assert await database_sync_to_async(DeviceSample.objects.count)() == 2  # device 0's samples kept


async def test_it_answers_malformed_frames_with_an_error_and_keeps_the_link(
    link: WebsocketCommunicator, agent_host: AgentHost
) -> None:
    bad: list[Any] = [
        "not json {",
        {"v": 2, "type": "heartbeat", "ts": 1.0},
        {"v": 1, "type": "desired_deployments", "deployments": []},  # only the control plane sends it
        telemetry_frame([device_sample(0, utilization_pct=150.0)]),
    ]
    expected_fields = ["", "v", "type", "devices[0].utilization_pct"]
    for frame, field in zip(bad, expected_fields, strict=True):
        if isinstance(frame, str):
            await link.send_to(text_data=frame)
        else:
            await link.send_json_to(frame)
        error = await link.receive_json_from(timeout=5)
        assert (error["type"], error["code"]) == ("error", "bad_frame")
        assert (error["field"] or "") == field, error
    await link.send_to(bytes_data=b"\x00")
    assert (await link.receive_json_from(timeout=5))["code"] == "bad_frame"

    await link.send_json_to(telemetry_frame([device_sample(0)]))  # still served
    await until(lambda: DeviceSample.objects.exists(), "the valid frame's sample stored")
    assert await link.receive_nothing(timeout=0.3)
    assert await database_sync_to_async(DeviceSample.objects.count)() == 1
    link_row = await database_sync_to_async(AgentLink.objects.get)(host=agent_host.host)
    assert link_row.frames_rejected == 5


async def test_it_records_deployment_status_and_the_replica_url(
    link: WebsocketCommunicator, agent_host: AgentHost, served_model: ServedModel
) -> None:
    deployment = await deploy(served_model, agent_host.host, 0)
    await link.receive_json_from(timeout=5)
    status = {"v": 1, "type": "deployment_status", "deployment_id": str(deployment.pk), "ts": 1.0e9}
    await link.send_json_to({**status, "state": "running", "restarts": 2, "port": 8123})
    await link.send_json_to({**status, "deployment_id": "999", "state": "running"})
    error = await link.receive_json_from(timeout=5)
    assert (error["code"], error["field"]) == ("unknown_deployment", "deployment_id")

    await database_sync_to_async(deployment.refresh_from_db)()
    assert deployment.observed_state == ObservedState.RUNNING and deployment.observed_at is not None
    replica = await database_sync_to_async(Replica.objects.get)(deployment=deployment)
    assert (replica.state, replica.restarts, replica.port) == ("running", 2, 8123)
    assert replica.base_url == "http://10.0.0.5:8123"

    await link.send_json_to({**status, "state": "failed", "restarts": 3, "error": "CUDA out of memory"})
    await until(
        lambda: Replica.objects.filter(deployment=deployment, restarts=3).exists(), "the failed status stored"
    )
    assert await link.receive_nothing(timeout=0.3)
    await database_sync_to_async(deployment.refresh_from_db)()
    replica = await database_sync_to_async(Replica.objects.get)(deployment=deployment)
    assert (deployment.observed_state, deployment.observed_message) == ("failed", "CUDA out of memory")
    assert (replica.restarts, replica.base_url) == (3, "")


async def test_it_refuses_every_frame_but_register_before_register(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        before = [
            telemetry_frame([device_sample(0)]),
            {"v": 1, "type": "heartbeat", "ts": 1.0},  # must not mark the host online
            {"v": 1, "type": "deployment_status", "deployment_id": "1", "state": "running", "ts": 1.0},
            {"v": 1, "type": "log_tail", "deployment_id": "1", "lines": ["x"]},
        ]
        for frame in before:
            await comm.send_json_to(frame)
            error = await comm.receive_json_from(timeout=5)
            assert (error["code"], error["field"]) == ("not_registered", "type"), frame["type"]
        host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
        assert host.last_seen_at is None and host.status != HostStatus.ONLINE
        await comm.send_json_to(register_frame())  # the link is still up
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        await comm.disconnect()


async def test_it_relays_commands_to_the_agent(link: WebsocketCommunicator, agent_host: AgentHost) -> None:
    from agents.services import send_command

    from gpu_agent.protocol import Command

    frame = Command("c1", "restart_deployment", "7").to_dict()
    await database_sync_to_async(send_command)(agent_host.host.pk, frame)
    assert await link.receive_json_from(timeout=5) == frame
