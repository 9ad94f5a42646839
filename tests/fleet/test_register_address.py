"""A `register` frame's `address` is checked like the agent's --address: a host name or IP address
alone, at most Host.address's length. The control plane used to store whatever a register carried
(``host:port``, a URL: every replica URL built from it was wrong; a value over the column's length:
a database error on PostgreSQL). A refused register is a bad frame like any other invalid one: an
`error` frame naming the field, nothing stored, the link up for a register that is right."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.test import override_settings
from inventory.models import Host

from gpu_agent.protocol import MAX_ADDRESS_LENGTH

from .conftest import AgentHost, agent_socket, register_frame


def test_the_protocols_address_limit_is_the_host_address_columns() -> None:
    # gpu_agent.protocol cannot import Django: its constant must follow the model by hand.
    assert Host._meta.get_field("address").max_length == MAX_ADDRESS_LENGTH


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.9:8001", "HOST:PORT"),
        ("http://10.0.0.9", "URL"),
        ("0.0.0.0", "unspecified"),
        ("a" * (MAX_ADDRESS_LENGTH + 1), f"limit of {MAX_ADDRESS_LENGTH} characters"),
    ],
)
async def test_a_register_with_an_address_the_gateway_could_not_use_is_refused_and_not_stored(
    agent_host: AgentHost, address: str, why: str
) -> None:
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        comm = agent_socket(agent_host, "/ws/agent/")
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame(address=address))
        answer = await comm.receive_json_from(timeout=5)
        assert (answer["type"], answer["code"], answer["field"]) == ("error", "bad_frame", "address")
        assert "must be a host name or IP address, with no port or scheme" in answer["message"]
        assert why in answer["message"]
        host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
        assert host.address == "10.0.0.5"  # as registered before, untouched
        # Not registered, the link still up: a register that is right goes through.
        await comm.send_json_to(register_frame(address="gpu-a.example.com"))
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
        assert host.address == "gpu-a.example.com"
        await comm.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_register_without_an_address_is_still_taken(agent_host: AgentHost) -> None:
    # "": not known (yet); the host's replicas get no URL until an agent registers one.
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        comm = agent_socket(agent_host, "/ws/agent/")
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame(address=""))
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        host = await database_sync_to_async(Host.objects.get)(pk=agent_host.host.pk)
        assert host.address == ""
        await comm.disconnect()
