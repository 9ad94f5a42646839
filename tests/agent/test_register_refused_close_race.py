"""A refused `register` stays a refusal when a heartbeat or telemetry send, racing the close
handshake the link starts after the refusal, sees the connection closed (code 1000) first."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from gpu_agent.link import AgentLink
from gpu_agent.protocol import Frame
from serving.backoff import Backoff
from tests.agent.test_link import REGISTER, telemetry
from tests.agent.test_register_refused import CONFLICT, RefusingControlPlane
from tests.agent.ws_server import wait_for


@pytest.mark.asyncio
@pytest.mark.parametrize("keep_link", [True, False], ids=["keeping-the-link", "closing"])
async def test_a_send_that_sees_the_refused_connection_closed_first_still_counts_a_refusal(
    keep_link: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    close = ClientConnection.close

    async def slow_close(self: ClientConnection, *args: Any, **kwargs: Any) -> None:
        await close(self, *args, **kwargs)
        await asyncio.sleep(0.1)  # meanwhile the heartbeat task sends on the closed connection

    monkeypatch.setattr(ClientConnection, "close", slow_close)
    srv = RefusingControlPlane(keep_link=keep_link)
    await srv.start()

    async def on_frame(frame: Frame) -> None:
        pass

    link = AgentLink(
        srv.url,
        "good-token",
        hello=lambda: [REGISTER],
        on_frame=on_frame,
        heartbeat_interval_s=0.005,
        backoff=Backoff(base_s=0.01, cap_s=0.02, seed=3),
    )
    link.submit_telemetry(telemetry(1.0))
    task = asyncio.create_task(link.run())
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_agent.link"):
            await wait_for(lambda: link.stats.failed_attempts >= 3, timeout=30)
    finally:
        link.stop()
        await asyncio.wait_for(task, 5)
        await srv.stop()
    downs = [r for r in caplog.records if r.name == "gpu_agent.link" and "down (" in r.getMessage()]
    assert len(downs) >= 3
    for r in downs:
        assert r.levelno == logging.ERROR, r.getMessage()
        assert "refused this agent's register" in r.getMessage() and CONFLICT in r.getMessage()
    # Every failed attempt was counted as a refusal (a send that saw the close first would have
    # made one a ConnectionClosed). One more refusal may have ended the session that stop() cut
    # short: it is counted, but stop() keeps it from counting as a failed attempt.
    stats = link.stats
    assert stats.failed_attempts <= stats.register_refusals <= stats.failed_attempts + 1, stats
