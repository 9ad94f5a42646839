"""A `register` frame's strings fit the control plane's columns: a host name, device uuid or name,
or agent version longer than its column is a bad frame naming the field (it was a database error
on PostgreSQL, answered only as "cannot store the registration"), and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from agents.models import AgentLink
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from inventory.models import Device, Host

from config.asgi import application
from gpu_agent.protocol import (
    MAX_AGENT_VERSION_LENGTH,
    MAX_DEVICE_NAME_LENGTH,
    MAX_DEVICE_UUID_LENGTH,
    MAX_HOST_NAME_LENGTH,
    ProtocolError,
    parse_frame,
)

from .conftest import AgentHost, register_frame


def test_the_protocols_string_limits_are_the_columns() -> None:
    # gpu_agent.protocol cannot import Django: its constants must follow the models by hand.
    assert Host._meta.get_field("name").max_length == MAX_HOST_NAME_LENGTH
    assert Device._meta.get_field("uuid").max_length == MAX_DEVICE_UUID_LENGTH
    assert Device._meta.get_field("name").max_length == MAX_DEVICE_NAME_LENGTH
    assert AgentLink._meta.get_field("agent_version").max_length == MAX_AGENT_VERSION_LENGTH


def _too_long(field: str) -> tuple[dict[str, Any], str]:
    frame = register_frame()
    if field == "host":
        frame["host"] = "h" * (MAX_HOST_NAME_LENGTH + 1)
        return frame, "host"
    if field == "agent_version":
        frame["agent_version"] = "v" * (MAX_AGENT_VERSION_LENGTH + 1)
        return frame, "agent_version"
    limit = MAX_DEVICE_UUID_LENGTH if field == "uuid" else MAX_DEVICE_NAME_LENGTH
    frame["devices"][0][field] = "d" * (limit + 1)
    return frame, f"devices[0].{field}"


@pytest.mark.parametrize("field", ["host", "agent_version", "uuid", "name"])
def test_a_string_longer_than_its_column_is_a_protocol_error_naming_it(field: str) -> None:
    frame, path = _too_long(field)
    with pytest.raises(ProtocolError) as err:
        parse_frame(frame, sender="agent")
    assert err.value.field == path and "characters" in str(err.value)
    at_limit = register_frame()
    at_limit["agent_version"] = "v" * MAX_AGENT_VERSION_LENGTH
    at_limit["devices"][0]["name"] = "d" * MAX_DEVICE_NAME_LENGTH
    parse_frame(at_limit, sender="agent")  # the limits themselves are fine


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize("field", ["agent_version", "uuid", "name"])
async def test_a_register_with_an_over_long_string_is_refused_and_not_stored(
    agent_host: AgentHost, field: str
) -> None:
    frame, path = _too_long(field)
    headers = [(b"authorization", f"Bearer {agent_host.token}".encode())]
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        assert (await comm.connect())[0]
        await comm.send_json_to(frame)
        answer = await comm.receive_json_from(timeout=5)
        assert (answer["type"], answer["code"], answer["field"]) == ("error", "bad_frame", path)
        devices = await database_sync_to_async(lambda: list(Device.objects.values_list("name", flat=True)))()
        assert all(len(n) <= MAX_DEVICE_NAME_LENGTH for n in devices)
        await comm.send_json_to(register_frame())  # the link is still up
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        await comm.disconnect()
