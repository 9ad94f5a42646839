"""An engine that misbehaves: the gateway still answers well-formed, records and releases.

Hypothesis makes the stand-in engine answer with streams of garbage events (bytes, invalid UTF-8,
JSON that is no object, chunks whose ``choices``/``usage``/``index``/``delta`` have wrong types,
counts that are negative, floats, NaN or far past any column), CRLF or LF line endings, streams
that end without ``[DONE]`` or break off, and non-streamed bodies that are no JSON object, each
cut into random byte pieces. For every example: nothing raises out of the ASGI app; a stream the
client gets is UTF-8 SSE whose events are ``data: `` + a strict JSON object or ``[DONE]``, ending
with ``[DONE]`` or the gateway's error event; the request is recorded once (usage and a latency
sample) with counts that fit their columns; no token reservation is left behind.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from gateway.models import RequestSample, TokenReservation, Usage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.asgi_driver import app_with, call

PATHS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    },
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 3},
}
SAMPLE_MAX = 2**31 - 1  # RequestSample's PositiveIntegerField
USAGE_MAX = 2**63 - 1  # Usage's PositiveBigIntegerField

BIG = st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**63) - 1, 10**400])
ODD = st.sampled_from([0.5, 3.0, -1.5, 1e308, True, False, "7", "", None, [3], {"n": 3}])
COUNTS = st.one_of(st.integers(0, 50), BIG, ODD)
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["x" * 3000, "\x00", "\ud800"]))
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), BIG, TEXT),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
# Written into an event as they are: JSON's non-standard constants and what no parser accepts.
RAW = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b'"\\ud800"', b"[" * 20_000, b"{"])


@st.composite
def usage(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(JSON_VALUES)
    return {name: draw(COUNTS) for name in ("prompt_tokens", "completion_tokens", "total_tokens")}


@st.composite
def choice(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 4)) == 0:
        return draw(JSON_VALUES)
    index = draw(st.one_of(st.integers(0, 3), COUNTS))
    delta = draw(st.one_of(st.fixed_dictionaries({"content": TEXT}), JSON_VALUES))
    return {"index": index, "delta": delta, "text": draw(st.one_of(TEXT, JSON_VALUES))}


@st.composite
def payload(draw: st.DrawFn) -> bytes:
    """One event's data: a chunk (right or wrongly typed), a usage chunk, an error, or garbage."""
    kind = draw(st.integers(0, 7))
    if kind <= 2:
        choices = draw(st.one_of(st.lists(choice(), max_size=3), JSON_VALUES))
        return json.dumps({"id": "c1", "choices": choices, "usage": draw(usage())}).encode()
    if kind == 3:
        return json.dumps({"id": "c1", "choices": [], "usage": draw(usage())}).encode()
    if kind == 4:
        error = draw(st.one_of(st.fixed_dictionaries({"message": TEXT, "code": COUNTS}), JSON_VALUES))
        return json.dumps({"error": error}).encode()
    if kind == 5:
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == 6:
        raw = draw(RAW)
        return b'{"choices": [], "usage": {"prompt_tokens": ' + raw + b', "completion_tokens": 1}}'
    return draw(st.one_of(st.binary(max_size=30), st.sampled_from([b"\xff\xfe\xfa", b"x" * 300_000])))


@st.composite
def stream(draw: st.DrawFn) -> bytes:
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    events = []
    for data in draw(st.lists(payload(), max_size=6)):
        prefix = draw(st.sampled_from([b"data: ", b"data:", b": ", b"event: x\ndata: ", b""]))
        events.append(prefix + data)
    end = draw(st.sampled_from([b"[DONE]", b"", b"[DONE] trailing"]))
    if end:
        events.append(b"data: " + end)
    body = b"".join(e.replace(b"\n", newline) + newline * 2 for e in events)
    if draw(st.booleans()):  # cut anywhere: a partial last event, or one without its blank line
        body = body[: draw(st.integers(0, len(body)))]
    return body


class Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes], error: Exception | None) -> None:
        self.pieces, self.error = pieces, error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece
        if self.error is not None:
            raise self.error


def split(data: st.DataObject, body: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8), label="cuts"))
    bounds = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def check_sse(body: bytes) -> list[Any]:
    """The client's stream: UTF-8 events ``data: <JSON object or [DONE]>``, each + a blank line."""
    text = body.decode("utf-8")
    assert text.endswith("\n\n"), text[-200:]
    events = []
    for event in text[:-2].split("\n\n"):
        assert event.startswith("data: ") and "\n" not in event and "\r" not in event, event[:200]
        data = event.removeprefix("data: ")
        events.append(data if data == "[DONE]" else strict_json(data))
        assert data == "[DONE]" or isinstance(events[-1], dict), data[:200]
    assert events, "an empty stream"
    assert events.count("[DONE]") <= 1 and ("[DONE]" not in events or events[-1] == "[DONE]")
    last = events[-1]
    assert last == "[DONE]" or set(last) == {"error"}, f"the stream ends with {str(last)[:200]}"
    return events


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_a_misbehaving_engine_gets_well_formed_answers_recorded_in_range(
    gateway_data: dict[str, Any], data: Any
) -> None:
    key = gateway_data["key"]
    key.requests_per_minute, key.tokens_per_day = 2**31 - 1, 2**62  # no quota answers in the way
    key.save(update_fields=["requests_per_minute", "tokens_per_day"])
    path = data.draw(st.sampled_from(sorted(PATHS)), label="path")
    streamed = data.draw(st.booleans(), label="stream")
    if streamed:
        body = data.draw(stream(), label="engine stream")
        status, ctype = 200, data.draw(st.sampled_from(["text/event-stream", "application/json", "x/\xe9"]))
    else:
        body = data.draw(
            st.one_of(
                st.binary(max_size=40),
                JSON_VALUES.map(lambda v: json.dumps(v).encode()),
                usage().map(lambda u: json.dumps({"id": "c1", "choices": [], "usage": u}).encode()),
                RAW.map(lambda raw: b'{"choices": [], "usage": {"prompt_tokens": ' + raw + b"}}"),
            ),
            label="engine body",
        )
        status = data.draw(st.sampled_from([200, 200, 200, 201, 204, 302, 400, 404, 429]), label="status")
        ctype = data.draw(st.sampled_from(["application/json", "text/html", "x/\xe9"]), label="content type")
    error = data.draw(st.sampled_from([None, None, httpx.ReadError("reset"), httpx.ReadTimeout("slow")]))
    pieces = split(data, body)

    def engine(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": ctype.encode("latin-1")}
        return httpx.Response(status, headers=headers, stream=Pieces(pieces, error))

    Usage.objects.all().delete()
    RequestSample.objects.all().delete()
    request = {**PATHS[path], "stream": streamed}
    result = asyncio.run(call(app_with(engine), path, request, gateway_data["secret"]))

    assert result.status is not None and result.status != 500, (result.status, result.body[:300])
    if streamed and result.status == 200:
        events = check_sse(result.body)
        # vLLM's error event is followed by [DONE]: any error event, or none at the end, failed.
        # The gateway's error events are {"error": {...}}; an engine chunk {"error": null} is none.
        failed = events[-1] != "[DONE]" or any(_is_error_event(e) for e in events)
    else:
        assert result.status in {200, 400, 404, 429, 502, 504}, (result.status, body[:300])
        failed = result.status != 200
        if result.status != 200:
            assert result.headers[b"content-type"] == b"application/json"
            assert set(result.json()) == {"error"}
        else:
            assert isinstance(strict_json(result.body.decode()), dict)
    sample = RequestSample.objects.get()
    assert sample.outcome == ("failed" if failed else "completed"), (sample.outcome, result.body[-300:])
    assert 0 <= sample.prompt_tokens <= SAMPLE_MAX and 0 <= sample.completion_tokens <= SAMPLE_MAX
    booked = Usage.objects.get()
    assert booked.requests == 1
    assert 0 <= booked.prompt_tokens <= USAGE_MAX and 0 <= booked.completion_tokens <= USAGE_MAX
    assert not TokenReservation.objects.exists()


def _is_error_event(event: Any) -> bool:
    return isinstance(event, dict) and set(event) == {"error"} and isinstance(event["error"], dict)
