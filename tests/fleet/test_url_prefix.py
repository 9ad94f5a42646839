"""Served under a URL prefix (ASGI ``root_path``, e.g. daphne --root-path /llm behind a proxy that
keeps the prefix), the request's ``path`` includes the prefix. The ASGI entry point routed /v1 and
the agents' sockets on the whole path: /llm/v1/... went to Django (a 404 page), /llm/ws/agent/ to
the browser sockets (refused). They are routed on the path below the prefix, as Django does."""

from __future__ import annotations

import json

import pytest
from asgiref.testing import ApplicationCommunicator
from django.test import override_settings

from config.asgi import application

from .conftest import AgentHost, agent_socket, register_frame

PREFIX = "/llm"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_gateway_answers_under_a_url_prefix() -> None:
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "path": f"{PREFIX}/v1/models",
        "root_path": PREFIX,
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1")],
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=30)
    body = await communicator.receive_output(timeout=30)
    assert start["status"] == 401  # the gateway's: no API key
    assert json.loads(body["body"])["error"]["type"] == "invalid_request_error"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_an_agent_registers_under_a_url_prefix(agent_host: AgentHost) -> None:
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        comm = agent_socket(agent_host, f"{PREFIX}/ws/agent/")
        comm.scope["root_path"] = PREFIX
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        await comm.disconnect()
