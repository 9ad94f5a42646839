"""An engine's answer too large to hold: GATEWAY_MAX_ENGINE_BODY_BYTES (a whole non-streamed answer)
and GATEWAY_MAX_ENGINE_EVENT_BYTES (one SSE event). Once read without a limit: a misbehaving engine
could make the gateway's process hold any amount of memory."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from gateway.models import RequestSample, TokenReservation, Usage
from gateway.streaming import StreamMeter

from tests.gateway.asgi_driver import CHAT, app_with, call, chunk, sse

STREAM = {**CHAT, "stream": True}
PIECE = 1000  # bytes the stand-in engine sends at a time
LIMIT = 10 * PIECE


class Endless(httpx.AsyncByteStream):
    """An engine's body: ``head``, then ``PIECE``-byte pieces of filler for as long as it is
    read (or ``pieces`` of them, then ``tail``); counts what was read and whether it was closed."""

    def __init__(self, head: bytes, pieces: int | None = None, tail: bytes = b"") -> None:
        self.head, self.pieces, self.tail = head, pieces, tail
        self.sent = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        while self.pieces is None or self.sent < self.pieces:
            self.sent += 1
            yield b"x" * PIECE
            await asyncio.sleep(0)
        yield self.tail

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def small_limits(settings: Any) -> None:
    settings.GATEWAY_MAX_ENGINE_BODY_BYTES = LIMIT
    settings.GATEWAY_MAX_ENGINE_EVENT_BYTES = LIMIT


def booked() -> tuple[str, int, int]:
    sample, usage = RequestSample.objects.get(), Usage.objects.get()
    assert (usage.prompt_tokens, usage.completion_tokens) == (sample.prompt_tokens, sample.completion_tokens)
    assert not TokenReservation.objects.exists()
    return sample.outcome, sample.prompt_tokens, sample.completion_tokens


def replica_warning(caplog: pytest.LogCaptureFixture, gateway_data: dict[str, Any]) -> str:
    replicas = {f"replica {d.replica.pk} " for d in gateway_data["deployments"]}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return next(w for w in warnings if "over" in w and any(r in w for r in replicas))


@pytest.mark.usefixtures("small_limits")
def test_a_non_streamed_answer_past_the_limit_is_a_502_and_its_reading_stops(
    gateway_data: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A valid completion, five times the limit: it was read whole and relayed (and an endless one
    held the request, and ever more memory, until the read timeout)."""
    head = b'{"id": "c1", "object": "chat.completion", "choices": [], "pad": "'
    tail = b'", "usage": {"prompt_tokens": 7, "completion_tokens": 1}}'
    engine = Endless(head, pieces=5 * LIMIT // PIECE, tail=tail)
    app = app_with(lambda request: httpx.Response(200, stream=engine))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 502 and result.json()["error"]["code"] == "upstream_failed"
    assert f"({LIMIT} bytes)" in result.json()["error"]["message"]
    assert engine.sent <= LIMIT // PIECE + 1 and engine.closed, "read past the limit, or left open"
    assert booked() == ("failed", 0, 0)
    assert f"answer over {LIMIT} bytes" in replica_warning(caplog, gateway_data)
    assert app.router.outstanding(gateway_data["deployments"][0].replica.pk) == 0


@pytest.mark.usefixtures("small_limits")
def test_an_engine_error_past_the_limit_is_a_502_too(gateway_data: dict[str, Any]) -> None:
    engine = Endless(b'{"error": {"message": "')
    app = app_with(lambda request: httpx.Response(400, stream=engine))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 502 and engine.sent <= LIMIT // PIECE + 1 and engine.closed
    assert booked() == ("failed", 0, 0)


@pytest.mark.usefixtures("small_limits")
def test_a_stream_event_past_the_limit_ends_the_stream_with_an_error_event(
    gateway_data: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """An event that never ends (no blank line): it was buffered for as long as the engine sent it."""
    before = sse(chunk("a", 7, 1)).removesuffix(b"data: [DONE]\n\n")
    engine = Endless(before + b'data: {"id": "c1", "choices": [], "pad": "')
    app = app_with(lambda request: httpx.Response(200, stream=engine))
    result = asyncio.run(call(app, "/v1/chat/completions", STREAM, gateway_data["secret"]))
    events = result.events()
    assert result.status == 200 and len(events) == 2
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "a"
    error = json.loads(events[1])["error"]
    assert error["code"] == "upstream_failed" and f"({LIMIT} bytes)" in error["message"]
    assert engine.sent <= LIMIT // PIECE + 1 and engine.closed, "read past the limit, or left open"
    assert booked() == ("failed", 7, 1)  # the usage the stream had reported
    assert f"SSE event over {LIMIT} bytes" in replica_warning(caplog, gateway_data)


@pytest.mark.usefixtures("small_limits")
def test_answers_up_to_the_limits_are_relayed(gateway_data: dict[str, Any]) -> None:
    # A stream of many events, each under the event limit, is more than it in all.
    pad = "p" * (LIMIT - 500)
    events = [{**chunk("a", 7, i + 1), "pad": pad} for i in range(5)]
    raw = sse(*events)
    app = app_with(lambda request: httpx.Response(200, stream=Endless(raw, pieces=0)))
    result = asyncio.run(call(app, "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert len(result.events()) == 6 and result.events()[-1] == "[DONE]"
    assert booked() == ("completed", 7, 5)


def test_the_meter_takes_an_event_of_the_limit_and_refuses_one_past_it() -> None:
    event = b'data: {"choices":[],"pad":"' + b"x" * 100 + b'"}'
    meter = StreamMeter(started=0.0, max_event_bytes=len(event))
    # Both in one piece: the first is returned, the second (one byte longer) stops the meter.
    events = meter.feed(event + b"\n\n" + event + b"y\n\n")
    assert events == [event + b"\n\n"] and meter.too_large
    assert meter.feed(b"data: [DONE]\n\n") == [] and meter.close() == [] and not meter.done
