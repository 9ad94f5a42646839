"""A request whose task is cancelled after an engine took it: daphne cancels its applications at
shutdown, and one that outlives its client by application_close_timeout (then every second until it
ends). What the engine served is booked as "disconnected", like a client's departure. Once the
cancellation left _serve before its booking: the reservation was released and the engine's tokens
were neither counted against the key's quota nor recorded as a sample."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from gateway import prompt_count, services
from gateway.models import RequestSample, TokenReservation, Usage
from gateway.proxy import GatewayApp

from tests.gateway.asgi_driver import CHAT, app_with, chunk


class StallingEngine:
    """A stand-in engine that answers ``/tokenize`` (a word a token, two more a message) and takes a
    completion: a stream's ``chunks`` then silence, or a non-streamed answer that never comes."""

    def __init__(self, chunks: list[dict[str, Any]] | None = None, tokenize_silent: bool = False) -> None:
        self.chunks, self.tokenize_silent = chunks, tokenize_silent
        self.stalled = asyncio.Event()  # the engine sent what it will, and is still generating
        self.aborted = False  # the gateway closed the engine's request
        self.tokenized = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            self.tokenized += 1
            if not request.headers.get("authorization", "").startswith("Bearer "):
                return httpx.Response(401, json={"error": "Unauthorized"})  # as engine_auth.py
            if self.tokenize_silent:
                await asyncio.Event().wait()
            messages = json.loads(request.content)["messages"]
            return httpx.Response(200, json={"count": sum(len(m["content"].split()) + 2 for m in messages)})
        if self.chunks is not None:
            return httpx.Response(200, content=self._stream(), headers={"content-type": "text/event-stream"})
        await self._generate()
        raise AssertionError("unreachable")

    async def _stream(self) -> AsyncIterator[bytes]:
        for one in self.chunks or []:
            yield b"data: " + json.dumps(one).encode() + b"\n\n"
        await self._generate()

    async def _generate(self) -> None:
        self.stalled.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.aborted = True
            raise


async def cancelled_request(
    app: GatewayApp, engine: StallingEngine, body: dict[str, Any], secret: str, cancel_every_s: float = 0.0
) -> list[bytes]:
    """Drive ``app`` with a client that stays; once the engine stalls, cancel the app's task (again
    every ``cancel_every_s`` until it ends, as daphne does, if not 0). Returns the bodies sent."""
    messages = [{"type": "http.request", "body": json.dumps(body).encode()}]
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays: the server cancels the request
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    headers = [(b"authorization", f"Bearer {secret}".encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    task = asyncio.ensure_future(app(scope, receive, send))
    # The relay asks for the next chunk once the client has the last: a stalled stream's are sent.
    await asyncio.wait_for(engine.stalled.wait(), 10)
    task.cancel()
    deadline = time.monotonic() + 10
    while not task.done() and time.monotonic() < deadline:
        await asyncio.wait({task}, timeout=cancel_every_s or None)
        if cancel_every_s:
            task.cancel()
    assert task.done(), "the cancelled request did not end"
    with pytest.raises(asyncio.CancelledError):
        task.result()  # the cancellation is raised once the request is booked
    return sent


def booked(gateway_data: dict[str, Any]) -> tuple[str, int, int]:
    sample, usage = RequestSample.objects.get(), Usage.objects.get()
    assert sample.deployment_id in {d.pk for d in gateway_data["deployments"]}
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (
        1,
        sample.prompt_tokens,
        sample.completion_tokens,
    )
    assert not TokenReservation.objects.exists(), "the reservation was not released"
    return sample.outcome, sample.prompt_tokens, sample.completion_tokens


def test_a_stream_cancelled_mid_answer_is_booked_with_the_usage_streamed(
    gateway_data: dict[str, Any],
) -> None:
    engine = StallingEngine(chunks=[chunk("a", 7, 1), chunk("b", 7, 2)])
    app = app_with(engine)
    body = {**CHAT, "stream": True}
    sent = asyncio.run(cancelled_request(app, engine, body, gateway_data["secret"]))
    assert b"".join(sent).count(b"data: ") == 2 and engine.aborted
    assert booked(gateway_data) == ("disconnected", 7, 2)
    assert RequestSample.objects.get().stream and engine.tokenized == 0


def test_a_non_streamed_request_cancelled_before_its_answer_is_booked_with_its_prompt_tokens(
    gateway_data: dict[str, Any],
) -> None:
    engine = StallingEngine()
    sent = asyncio.run(cancelled_request(app_with(engine), engine, CHAT, gateway_data["secret"]))
    assert sent == [] and engine.aborted and engine.tokenized == 1
    assert booked(gateway_data) == ("disconnected", 3, 0)  # "hi": one word, two for the template


def test_the_booking_survives_cancellations_that_keep_coming(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daphne cancels an application that outlives its client again every second: neither a slow
    /tokenize (bounded shortly when cancelled) nor a slow database stops the booking."""
    monkeypatch.setattr(prompt_count, "TOKENIZE_TIMEOUT_S", 60.0)  # past the driver's 10 s
    monkeypatch.setattr(prompt_count, "CANCELLED_TOKENIZE_TIMEOUT_S", 0.3)
    finishing = threading.Event()
    monkeypatch.setattr(services, "finish", slowly(services.finish, finishing))
    engine = StallingEngine(tokenize_silent=True)
    secret = gateway_data["secret"]
    asyncio.run(cancelled_request(app_with(engine), engine, CHAT, secret, cancel_every_s=0.05))
    assert finishing.is_set() and engine.tokenized == 1
    assert booked(gateway_data) == ("disconnected", 0, 0)


def slowly(finish: Callable[..., None], finishing: threading.Event) -> Callable[..., None]:
    def slow_finish(*args: Any) -> None:
        finishing.set()
        time.sleep(0.3)  # several cancellations come meanwhile
        finish(*args)

    return slow_finish


class SlowToCloseEngine(StallingEngine):
    """Its stream takes ``close_s`` to close once the gateway gives it up."""

    def __init__(self, chunks: list[dict[str, Any]], close_s: float) -> None:
        super().__init__(chunks=chunks)
        self.close_s = close_s
        self.closing = asyncio.Event()

    async def _generate(self) -> None:
        try:
            await super()._generate()
        finally:
            self.closing.set()
            await asyncio.sleep(self.close_s)


def test_a_cancellation_while_a_departed_clients_request_winds_down_is_raised_after_its_booking(
    gateway_data: dict[str, Any],
) -> None:
    """The client leaves; while the relay closes the engine's stream, daphne cancels the task (its
    application_close_timeout). The cancellation was swallowed there: the request was booked
    without the short /tokenize bound and the task ended as if nothing had happened."""
    engine = SlowToCloseEngine([chunk("a", 7, 1)], close_s=0.3)
    app = app_with(engine)
    body = json.dumps({**CHAT, "stream": True}).encode()

    async def scenario() -> asyncio.Future[None]:
        gone = asyncio.Event()
        messages = [{"type": "http.request", "body": body}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            pass

        headers = [(b"authorization", f"Bearer {gateway_data['secret']}".encode())]
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
        task = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(engine.stalled.wait(), 10)
        gone.set()  # the client leaves
        await asyncio.wait_for(engine.closing.wait(), 10)  # the relay is closing the engine's stream
        task.cancel()
        await asyncio.wait({task}, timeout=10)
        return task

    task = asyncio.run(scenario())
    assert task.done()
    with pytest.raises(asyncio.CancelledError):
        task.result()
    assert engine.aborted
    assert booked(gateway_data) == ("disconnected", 7, 1)
