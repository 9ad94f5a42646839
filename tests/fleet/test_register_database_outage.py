"""A `register` the database cannot take *now* (it went away, a lock or statement timeout) is not a
refusal: the control plane sends no `register_refused` and counts nothing; the connection ends as a
failed handler ends one (daphne: close 1011) and the agent reconnects like after any drop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from agents import services
from agents.models import AgentLink
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import InterfaceError, OperationalError

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


async def raised_with_nothing_sent(comm: WebsocketCommunicator) -> BaseException:
    """What the consumer raised, ending the connection (daphne then closes the socket with 1011),
    after checking that it sent nothing first: no error frame, no close of its own."""
    await asyncio.wait({comm.future}, timeout=30)
    assert comm.output_queue.empty(), f"sent {comm.output_queue.get_nowait()}"
    assert comm.future.done(), "the connection is still open"
    exc = comm.future.exception()
    assert exc is not None, "the consumer ended without an error"
    return exc


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
            assert await raised_with_nothing_sent(comm) is error
        link = await database_sync_to_async(AgentLink.objects.get)(host=agent_host.host)
        assert link.frames_rejected == 0 and not link.connected
        logged = [r.getMessage() for r in caplog.records if r.name == "agents.consumers"]
        assert any("gpu-a" in m and str(error) in m and "1011" in m for m in logged), logged
        assert not any("Refused" in m for m in logged), logged
        again = communicator(agent_host.token)  # the agent's reconnect, once the database is back
        await registers(again)
        await again.disconnect()
