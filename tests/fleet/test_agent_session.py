"""The life of an agent connection: one live connection per host, revoked tokens cut open sessions,
clean-up however the connection ends, values the database cannot hold refused with the link kept,
and log tails relayed only for the sender's own deployments."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from agents import services
from agents.ingest import writer
from agents.models import AgentLink, DeviceSample, Replica
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from deployments.models import Deployment
from deployments.services import create_deployment
from django.db import DataError
from django.test import override_settings
from inventory.models import AgentToken, Device, DeviceKind, Host
from inventory.services import issue_agent_token, register_host
from registry.models import ServedModel

from gpu_agent.protocol import CLOSE_REGISTER_REFUSED

from .conftest import AgentHost, device_sample, register_frame, telemetry_frame
from .test_agent_consumer import NO_SWEEP, communicator

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]
FAST_POLL = override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=0.2)


async def registered(token: str) -> WebsocketCommunicator:
    """A connected agent of gpu-a that registered; its first desired list consumed."""
    comm = communicator(token)
    assert (await comm.connect())[0]
    await comm.send_json_to(register_frame())
    assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
    return comm


async def closed_with(comm: WebsocketCommunicator, error_code: str) -> int:
    """The close code after the `error` frame that explains it."""
    error = await comm.receive_json_from(timeout=5)
    assert (error["type"], error["code"]) == ("error", error_code), error
    closing = await comm.receive_output(timeout=5)
    assert closing["type"] == "websocket.close"
    return int(closing["code"])


def link_of(host: Host) -> AgentLink:
    return AgentLink.objects.get(host=host)


def running_tasks(prefix: str) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(prefix) and not t.done()]


# ---- one live connection per host ----------------------------------------------------------------


async def test_a_newer_connection_of_the_host_closes_the_older_one(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        old = await registered(agent_host.token)
        new = await registered(agent_host.token)
        assert await closed_with(old, "superseded") == 4409
        await old.disconnect()
        # The older connection's end leaves the link to the newer one.
        assert (await database_sync_to_async(link_of)(agent_host.host)).connected
        command = {"v": 1, "type": "command", "command_id": "c1", "action": "restart_deployment",
                   "deployment_id": "7", "lines": 100}  # fmt: skip
        await database_sync_to_async(services.send_command)(agent_host.host.pk, command)
        assert await new.receive_json_from(timeout=5) == command  # only the live one runs commands
        await new.disconnect()
        assert not (await database_sync_to_async(link_of)(agent_host.host)).connected


async def test_a_connection_notices_a_newer_one_registered_by_another_process(agent_host: AgentHost) -> None:
    with FAST_POLL:
        comm = await registered(agent_host.token)
        # What another ASGI process's `register` leaves in the database (no message reaches us).
        later = (await database_sync_to_async(link_of)(agent_host.host)).connected_at + timedelta(seconds=1)
        await database_sync_to_async(AgentLink.objects.filter(host=agent_host.host).update)(
            connected_at=later
        )
        assert await closed_with(comm, "superseded") == 4409
        await comm.disconnect()
        assert (await database_sync_to_async(link_of)(agent_host.host)).connected


# ---- revoked tokens ------------------------------------------------------------------------------


async def test_rotating_the_token_closes_the_session_that_used_the_old_one(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        await database_sync_to_async(issue_agent_token)(agent_host.host)
        assert await closed_with(comm, "unauthorized") == 4401
        await comm.send_json_to(telemetry_frame([device_sample(0)]))  # sent before it saw the close
        assert await comm.receive_nothing(timeout=0.3)
        await writer().flush()
        assert await database_sync_to_async(DeviceSample.objects.count)() == 0  # dropped
        await comm.disconnect()
        assert not (await database_sync_to_async(link_of)(agent_host.host)).connected


async def test_a_session_notices_a_token_revoked_by_another_process(agent_host: AgentHost) -> None:
    with FAST_POLL:
        comm = await registered(agent_host.token)
        # `manage.py register_host` in another process: no channel message reaches this one.
        await database_sync_to_async(AgentToken.objects.filter(host=agent_host.host).update)(revoked=True)
        assert await closed_with(comm, "unauthorized") == 4401
        await comm.disconnect()


async def test_a_token_revoked_before_register_cannot_register(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await database_sync_to_async(issue_agent_token)(agent_host.host)
        await comm.send_json_to(register_frame())
        assert await closed_with(comm, "unauthorized") == 4401
        assert not await database_sync_to_async(Device.objects.exists)()


async def test_a_connection_that_never_registered_is_closed_once_its_token_is_revoked(
    agent_host: AgentHost,
) -> None:
    with FAST_POLL:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        # Revoked elsewhere (a leaked token rotated): the connection must not stay open for ever,
        # still sending frames that are logged and counted.
        await database_sync_to_async(AgentToken.objects.filter(host=agent_host.host).update)(revoked=True)
        assert await closed_with(comm, "unauthorized") == 4401
        await comm.disconnect()


# ---- clean-up however the connection ends --------------------------------------------------------


async def test_a_handler_that_raises_still_releases_the_connection(agent_host: AgentHost) -> None:
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        await asyncio.sleep(0.05)  # the probe relay's poller starts
        assert running_tasks(f"agent-watch:{agent_host.host.pk}") and running_tasks("probe-relay")
        # No handler for this type: dispatch raises, and daphne would close the socket with 1011
        # without a websocket.disconnect (so without disconnect()).
        await get_channel_layer().group_send(services.agent_group(agent_host.host.pk), {"type": "no.such"})
        with pytest.raises(ValueError, match="No handler"):
            await comm.wait(timeout=5)
        assert running_tasks("agent-watch") == [] and running_tasks("probe-relay") == []
        assert not (await database_sync_to_async(link_of)(agent_host.host)).connected


# ---- values the database cannot hold: an error frame, the link stays up ---------------------------


STATUS = {"v": 1, "type": "deployment_status", "deployment_id": "1", "state": "running", "ts": 1.0}


def _huge_device(frame: dict[str, Any], **values: int) -> dict[str, Any]:
    frame["devices"][0].update(values)
    return frame


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (lambda: _huge_device(register_frame(), memory_total_bytes=2**70), "devices[0].memory_total_bytes"),
        (lambda: _huge_device(register_frame(), index=2**70), "devices[0].index"),
        (lambda: {**telemetry_frame([device_sample(0)]), "ts": 1e20}, "ts"),
        (lambda: {**telemetry_frame([device_sample(0)]), "ts": -1e15}, "ts"),
        (
            lambda: telemetry_frame([device_sample(0, memory_used_bytes=2**63)]),
            "devices[0].memory_used_bytes",
        ),
        (lambda: {**STATUS, "ts": 1e20}, "ts"),
    ],
)
async def test_it_refuses_values_it_cannot_store_and_keeps_the_link(
    agent_host: AgentHost, frame: Any, field: str
) -> None:
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        await comm.send_json_to(frame())
        error = await comm.receive_json_from(timeout=5)
        assert (error["code"], error["field"]) == ("bad_frame", field)
        await comm.send_json_to({"v": 1, "type": "heartbeat", "ts": 1.0})
        assert await comm.receive_nothing(timeout=0.3)  # still served
        assert (await database_sync_to_async(link_of)(agent_host.host)).connected
        await comm.disconnect()


async def test_a_registration_the_database_refuses_is_answered_and_the_agent_reconnects(
    agent_host: AgentHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every later frame of an unregistered connection would be refused, so the refusal closes it
    # (4422, gpu_agent/PROTOCOL.md "Refused register"): the agent reconnects with backoff.
    real = services.register

    def refused_once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(services, "register", real)
        raise DataError("integer out of range")  # what PostgreSQL says about an oversized value

    monkeypatch.setattr(services, "register", refused_once)
    with NO_SWEEP:
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        error = await comm.receive_json_from(timeout=5)
        assert error["code"] == "register_refused" and "integer out of range" in error["message"]
        assert (await comm.receive_output(timeout=5)) == {
            "type": "websocket.close",
            "code": CLOSE_REGISTER_REFUSED,
        }
        await comm.disconnect()
        again = communicator(agent_host.token)
        assert (await again.connect())[0]
        await again.send_json_to(register_frame())
        assert (await again.receive_json_from(timeout=5))["type"] == "desired_deployments"
        await again.disconnect()


async def test_a_status_the_database_refuses_is_answered_and_the_link_kept(
    agent_host: AgentHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Replica:
        raise DataError("integer out of range")

    monkeypatch.setattr(services, "report_status", refused)
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        await comm.send_json_to(STATUS)
        assert (await comm.receive_json_from(timeout=5))["code"] == "bad_frame"
        assert (await database_sync_to_async(link_of)(agent_host.host)).connected
        await comm.disconnect()


# ---- log tails ---------------------------------------------------------------------------------------


def _deployment_on(host_name: str, model: ServedModel) -> Deployment:
    host = register_host(host_name, "10.0.0.7")
    device, _ = Device.objects.get_or_create(
        host=host,
        index=0,
        defaults={"uuid": f"GPU-{host_name}-0", "name": "H100", "kind": DeviceKind.GPU,
                  "memory_total_bytes": 80 << 30},
    )  # fmt: skip
    return create_deployment(model, host, [device])


async def test_it_relays_log_tails_only_for_the_agents_own_deployments(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        own = await database_sync_to_async(_deployment_on)("gpu-a", served_model)
        await comm.receive_json_from(timeout=5)  # the desired list with it
        other = await database_sync_to_async(_deployment_on)("gpu-b", served_model)
        layer = get_channel_layer()
        viewers = {}
        for dep in (own, other):  # what a dashboard log socket joins
            viewers[dep.pk] = await layer.new_channel()
            await layer.group_add(f"agents.logs.{dep.pk}", viewers[dep.pk])

        tail = {"v": 1, "type": "log_tail", "lines": ["ERROR: all is lost"]}
        await comm.send_json_to({**tail, "deployment_id": str(other.pk)})
        error = await comm.receive_json_from(timeout=5)
        assert (error["code"], error["field"]) == ("unknown_deployment", "deployment_id")
        await comm.send_json_to({**tail, "deployment_id": str(own.pk)})
        relayed = await asyncio.wait_for(layer.receive(viewers[own.pk]), 5)
        assert relayed["lines"] == ["ERROR: all is lost"]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive(viewers[other.pk]), 0.3)
        await comm.disconnect()


async def test_it_relays_a_log_tail_whose_id_has_leading_zeros_to_the_deployments_viewers(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        own = await database_sync_to_async(_deployment_on)("gpu-a", served_model)
        await comm.receive_json_from(timeout=5)  # the desired list with it
        layer = get_channel_layer()
        viewer = await layer.new_channel()
        await layer.group_add(f"agents.logs.{own.pk}", viewer)
        # The id names the deployment (its digits, as every other frame reads them), but made a
        # group name as written it was one no socket joins, or past channels' 100 characters one
        # that raised TypeError: the handler crashed and took the agent's link with it.
        for wire_id in ("0" + str(own.pk), "0" * 120 + str(own.pk)):
            tail = {"v": 1, "type": "log_tail", "deployment_id": wire_id, "lines": [wire_id]}
            await comm.send_json_to(tail)
            relayed = await asyncio.wait_for(layer.receive(viewer), 5)
            assert relayed["lines"] == [wire_id]
        await comm.send_json_to({"v": 1, "type": "heartbeat", "ts": 1.0})
        assert await comm.receive_nothing(timeout=0.3)  # the link is up: no error, no close
        await comm.disconnect()


@pytest.mark.parametrize("deployment_id", ["1" * 30, "9" * 5000])  # beyond int64; beyond int()
async def test_it_answers_deployment_ids_no_database_key_can_hold(
    agent_host: AgentHost, deployment_id: str
) -> None:
    with NO_SWEEP:
        comm = await registered(agent_host.token)
        engine = {"deployment_id": deployment_id, "state": "running"}
        for frame in (
            {**STATUS, "deployment_id": deployment_id},
            {"v": 1, "type": "log_tail", "deployment_id": deployment_id, "lines": ["x"]},
            telemetry_frame([device_sample(0)], [engine]),
        ):
            await comm.send_json_to(frame)
            error = await comm.receive_json_from(timeout=5)
            assert error["code"] == "unknown_deployment", frame["type"]
        await comm.disconnect()
