"""The control-plane link against a real websocket server (tests/agent/ws_server.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection

from gpu_agent.link import AgentLink, agent_ws_url
from gpu_agent.protocol import (
    Command,
    DeploymentStatus,
    DeviceInfo,
    DeviceSample,
    Frame,
    Register,
    Telemetry,
    dumps,
)
from serving.backoff import Backoff
from tests.agent.ws_server import ControlPlaneStub, wait_for

REGISTER = Register("host-a", "127.0.0.1", "test", False, [DeviceInfo(0, "CPU-x", "cpu", "cpu", 2**30)])


def telemetry(ts: float) -> Telemetry:
    return Telemetry(ts=ts, devices=[DeviceSample(0, 1, 2)])


class Harness:
    def __init__(self, server: ControlPlaneStub, token: str = "good-token", **kwargs: Any) -> None:
        self.received: list[Frame] = []
        kwargs.setdefault("backoff", Backoff(base_s=0.05, cap_s=0.2, seed=1))
        self.link = AgentLink(server.url, token, hello=lambda: [REGISTER], on_frame=self._on_frame, **kwargs)
        self.task: asyncio.Task[None] | None = None

    async def _on_frame(self, frame: Frame) -> None:
        self.received.append(frame)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AgentLink]:
        self.task = asyncio.create_task(self.link.run())
        try:
            yield self.link
        finally:
            self.link.stop()
            await asyncio.wait_for(self.task, 5)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ControlPlaneStub]:
    srv = ControlPlaneStub()
    await srv.start()
    yield srv
    with contextlib.suppress(AssertionError):
        await srv.stop()


def test_it_builds_the_agent_websocket_url() -> None:
    assert agent_ws_url("http://cp:8000") == "ws://cp:8000/ws/agent/"
    assert agent_ws_url("https://cp.example/base/") == "wss://cp.example/base/ws/agent/"
    assert agent_ws_url("ws://cp/ws/agent/") == "ws://cp/ws/agent/"
    with pytest.raises(ValueError, match="ftp://cp"):
        agent_ws_url("ftp://cp")


def test_it_backs_off_exponentially_with_capped_seeded_jitter() -> None:
    a, b = Backoff(base_s=1, cap_s=8, seed=7), Backoff(base_s=1, cap_s=8, seed=7)
    delays = [a.next_delay() for _ in range(8)]
    assert delays == [b.next_delay() for _ in range(8)]
    for d, nominal in zip(delays, [1, 2, 4, 8, 8, 8, 8, 8], strict=True):
        assert nominal / 2 <= d <= nominal
    a.reset()
    assert 0.5 <= a.next_delay() <= 1


@pytest.mark.asyncio
async def test_it_registers_first_then_heartbeats_about_every_second(server: ControlPlaneStub) -> None:
    h = Harness(server, heartbeat_interval_s=1.0)
    async with h.running() as link:
        await wait_for(lambda: len(server.of_type("heartbeat")) >= 3)
        link.submit_telemetry(telemetry(1.0))
        await wait_for(lambda: len(server.of_type("telemetry")) == 1)
    assert server.frames[0][1]["type"] == "register"
    assert server.frames[0][1]["host"] == "host-a"
    # The link's send times: when the server's side of this loop reads them is no part of the cadence.
    beats = [f["ts"] for f in server.of_type("heartbeat")]
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert all(0.8 <= g <= 1.6 for g in gaps), gaps
    assert server.of_type("telemetry")[0]["dropped"] == 0


@pytest.mark.asyncio
async def test_it_reconnects_after_a_restart_and_flushes_the_bounded_buffer(server: ControlPlaneStub) -> None:
    h = Harness(server, buffer_size=5)
    async with h.running() as link:
        await wait_for(lambda: link.connected)
        link.submit_telemetry(telemetry(1))
        link.submit_telemetry(telemetry(2))
        await wait_for(lambda: len(server.of_type("telemetry")) == 2)

        await server.stop()
        await wait_for(lambda: not link.connected)
        for ts in range(100, 112):  # 12 frames into a buffer of 5: the 7 oldest are dropped
            link.submit_telemetry(telemetry(ts))
        assert link.buffered == 5 and link.stats.dropped == 7

        await server.start()  # same port
        await wait_for(lambda: len(server.of_type("telemetry")) == 7)
        assert link.stats.connects == 2
    flushed = server.of_type("telemetry")[2:]
    assert [f["ts"] for f in flushed] == [107, 108, 109, 110, 111]
    assert all(f["dropped"] == 7 for f in flushed)
    assert [f["type"] for _, f in server.frames].count("register") == 2
    assert link.buffered == 0


@pytest.mark.asyncio
async def test_it_rejects_malformed_frames_and_keeps_the_link(
    server: ControlPlaneStub, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(server)
    with caplog.at_level(logging.WARNING, logger="gpu_agent.link"):
        async with h.running() as link:
            await wait_for(lambda: link.connected)
            await server.push("{not json")
            await server.push(
                '{"v": 1, "type": "command", "command_id": "c", "action": "explode", "deployment_id": "d"}'
            )
            await server.push(dumps(REGISTER))  # an agent-only frame
            await server.push(dumps(Command("c2", "tail_log", "d1", lines=5)))
            await wait_for(lambda: len(h.received) == 1)
            await wait_for(lambda: len(server.of_type("error")) == 3)
            assert link.connected and link.stats.connects == 1
    assert h.received == [Command("c2", "tail_log", "d1", lines=5)]
    assert link.stats.rejected_frames == 3
    errors = server.of_type("error")
    assert [e["field"] for e in errors] == [None, "action", "type"]
    assert all(e["code"] == "bad_frame" for e in errors)
    logged = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(logged) == 3 and "action" in logged[1]


@pytest.mark.asyncio
async def test_it_reports_a_refused_token_and_retries_with_backoff(
    server: ControlPlaneStub, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(server, token="wrong", backoff=Backoff(base_s=0.2, cap_s=0.4, seed=3))
    with caplog.at_level(logging.ERROR, logger="gpu_agent.link"):
        started = time.monotonic()
        async with h.running() as link:
            await wait_for(lambda: link.stats.auth_refusals >= 4)
            took = time.monotonic() - started
    # Four attempts wait out three delays of >= 0.1, 0.2 and 0.2 s: retries, not a hot loop.
    assert took >= 0.5, took
    assert link.stats.auth_refusals == server.handshakes
    assert link.stats.connects == 0 and server.frames == []
    errors = [r.getMessage() for r in caplog.records]
    assert errors and all("refused the host token (HTTP 403)" in m for m in errors)


@pytest.mark.asyncio
async def test_it_treats_an_auth_close_code_as_a_refused_token(caplog: pytest.LogCaptureFixture) -> None:
    srv = ControlPlaneStub(close_code=4403)
    await srv.start()
    h = Harness(srv, backoff=Backoff(base_s=0.2, cap_s=0.4, seed=3))
    try:
        with caplog.at_level(logging.ERROR, logger="gpu_agent.link"):
            async with h.running() as link:
                await wait_for(lambda: link.stats.auth_refusals >= 2)
    finally:
        await srv.stop()
    assert any("close code 4403" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_it_sends_frames_raised_during_the_handshake_after_register(
    server: ControlPlaneStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sends that wait (as under network backpressure) let other tasks run mid-handshake.
    original = ClientConnection.send

    async def slow_send(self: ClientConnection, message: Any, text: bool | None = None) -> None:
        await asyncio.sleep(0.01)
        await original(self, message, text=text)

    monkeypatch.setattr(ClientConnection, "send", slow_send)
    sent: list[asyncio.Task[bool]] = []
    h = Harness(server)

    def hello() -> list[Frame]:
        # A status change lands while the hello is being sent.
        status = DeploymentStatus("d1", "running", 1.0)
        sent.append(asyncio.get_running_loop().create_task(h.link.send(status)))
        return [REGISTER]

    h.link._hello = hello
    async with h.running() as link:
        await wait_for(lambda: len(server.of_type("deployment_status")) == 1)
        assert link.connected
    assert sent[0].result() is True
    assert [f["type"] for _, f in server.frames][:2] == ["register", "deployment_status"]


async def ignore(frame: Frame) -> None:
    pass


class SlowSocket:
    """A connection whose sends finish only when `release` is set (a slow or congested link)."""

    def __init__(self) -> None:
        self.sent: list[float] = []  # telemetry ts, in the order the sends finished
        self.sending = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, text: str) -> None:
        self.sending.set()
        await self.release.wait()
        self.sent.append(json.loads(text)["ts"])


@pytest.mark.asyncio
async def test_it_drops_the_oldest_waiting_frame_when_the_buffer_fills_during_a_send() -> None:
    link = AgentLink("ws://127.0.0.1:9", "t", hello=list, on_frame=ignore, buffer_size=3)
    for ts in (1, 2, 3):
        link.submit_telemetry(telemetry(ts))
    ws = SlowSocket()
    flush = asyncio.create_task(link._flush(ws))  # type: ignore[arg-type]
    await asyncio.wait_for(ws.sending.wait(), 5)  # frame 1 is on its way, 2 and 3 wait
    link.submit_telemetry(telemetry(4))  # the buffer holds 3: room, frame 1 is no longer in it
    link.submit_telemetry(telemetry(5))  # full: the oldest waiting frame (2) is dropped
    ws.release.set()
    await wait_for(lambda: len(ws.sent) == 4)
    flush.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flush
    assert ws.sent == [1, 3, 4, 5]  # in order; only the dropped frame is missing
    assert link.stats.dropped == 1 and link.stats.telemetry_sent == 4


@pytest.mark.asyncio
async def test_it_keeps_a_frame_whose_send_was_cut_off_for_the_next_connection() -> None:
    link = AgentLink("ws://127.0.0.1:9", "t", hello=list, on_frame=ignore, buffer_size=3)
    for ts in (1, 2):
        link.submit_telemetry(telemetry(ts))
    ws = SlowSocket()
    flush = asyncio.create_task(link._flush(ws))  # type: ignore[arg-type]
    await asyncio.wait_for(ws.sending.wait(), 5)
    flush.cancel()  # the connection went while frame 1 was on its way
    with contextlib.suppress(asyncio.CancelledError):
        await flush
    assert link.buffered == 2
    ws = SlowSocket()
    ws.release.set()
    flush = asyncio.create_task(link._flush(ws))  # type: ignore[arg-type]
    await wait_for(lambda: len(ws.sent) == 2)
    flush.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flush
    assert ws.sent == [1, 2] and link.stats.dropped == 0
