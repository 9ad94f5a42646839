"""A `register` the database cannot take *now* (it went away, a lock or statement timeout) is not a
refusal: the control plane sends no `register_refused` and counts nothing; it closes the connection
with 4503 (try again) and the agent reconnects like after any drop."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from agents import services
from agents.models import AgentLink
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import InterfaceError, OperationalError

from gpu_agent.protocol import CLOSE_TRY_AGAIN
from tests.control_plane.test_api_backing_services import _django_error, _down

from .conftest import AgentHost, register_frame
from .test_agent_consumer import NO_SWEEP, communicator

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]

PASSING_ERRORS = [
    OperationalError("canceling statement due to lock timeout"),
    OperationalError("server closed the connection unexpectedly"),
    InterfaceError("connection already closed"),
]


async def registers(comm: WebsocketCommunicator) -> None:
    assert (await comm.connect())[0]
    await comm.send_json_to(register_frame())
    assert (await comm.receive_json_from(timeout=10))["type"] == "desired_deployments"


async def closed_with_nothing_sent_first(comm: WebsocketCommunicator) -> int:
    """The code the consumer closed the connection with, after checking that it sent nothing
    before the close (no error frame)."""
    message = await comm.receive_output(timeout=30)
    assert message["type"] == "websocket.close", f"sent {message}"
    return int(message["code"])


@pytest.mark.parametrize("error", PASSING_ERRORS, ids=lambda e: str(e))
async def test_it_ends_a_register_the_database_cannot_take_now_without_refusing_it(
    agent_host: AgentHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    real = services.register

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(services, "register", real)
        raise error

    with NO_SWEEP:
        first = communicator(agent_host.token)
        await registers(first)  # the host's link row exists: a refusal would be counted there
        await first.disconnect()
        monkeypatch.setattr(services, "register", fails_once)
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        with caplog.at_level(logging.WARNING, logger="agents.consumers"):
            await comm.send_json_to(register_frame())
            assert await closed_with_nothing_sent_first(comm) == CLOSE_TRY_AGAIN
            # A frame in flight as it closed is dropped, not answered with an error.
            await comm.send_json_to({"v": 1, "type": "heartbeat", "ts": 1.0})
            assert await comm.receive_nothing(timeout=0.3)
            await comm.disconnect()  # daphne's websocket.disconnect: the consumer ends, no error
            assert comm.future.done() and comm.future.exception() is None
        link = await database_sync_to_async(AgentLink.objects.get)(host=agent_host.host)
        assert link.frames_rejected == 0 and not link.connected
        logged = [r.getMessage() for r in caplog.records if r.name == "agents.consumers"]
        assert any("gpu-a" in m and str(error) in m and "4503" in m for m in logged), logged
        assert not any("Refused" in m for m in logged), logged
        again = communicator(agent_host.token)  # the agent's reconnect, once the database is back
        await registers(again)
        await again.disconnect()


@pytest.mark.parametrize("error", PASSING_ERRORS[1:], ids=lambda e: str(e))
async def test_it_asks_an_agent_whose_token_cannot_be_checked_now_to_try_again(
    agent_host: AgentHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    """Not refused before accept(): daphne's HTTP 403 is what the agent counts as a refused token
    (gpu_agent/link.py). It used to raise out of the ASGI app: HTTP 500 and a traceback per agent."""
    if isinstance(error, OperationalError):  # as Django raises it: from the driver's error
        error = _django_error(str(error), psycopg.OperationalError(str(error)))
    monkeypatch.setattr(services, "authenticate", _down(error))
    with NO_SWEEP, caplog.at_level(logging.WARNING):
        comm = communicator(agent_host.token)
        assert (await comm.connect())[0]
        assert await closed_with_nothing_sent_first(comm) == CLOSE_TRY_AGAIN
        await comm.wait()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "/ws/agent/" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None, caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
