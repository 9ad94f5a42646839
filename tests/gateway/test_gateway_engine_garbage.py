"""Regressions of the engine-garbage walk (test_gateway_engine_garbage_properties.py): what a
misbehaving engine sent, and what the client gets and the gateway books since."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from gateway.models import RequestSample, TokenReservation, Usage
from gateway.streaming import StreamMeter

from tests.gateway.asgi_driver import CHAT, app_with, call, chunk, final_usage, sse

STREAM = {**CHAT, "stream": True}


def stream_of(*pieces: bytes) -> Any:
    """An app whose engine streams ``pieces`` (as the network hands them over)."""

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    return app_with(lambda request: httpx.Response(200, content=body()))


def booked() -> tuple[str, int, int]:
    sample, usage = RequestSample.objects.get(), Usage.objects.get()
    assert (usage.prompt_tokens, usage.completion_tokens) == (sample.prompt_tokens, sample.completion_tokens)
    assert not TokenReservation.objects.exists()
    return sample.outcome, sample.prompt_tokens, sample.completion_tokens


def with_usage(usage: bytes, choices: bytes = b"[]") -> bytes:
    return b'data: {"id": "c1", "choices": ' + choices + b', "usage": ' + usage + b"}\n\n"


@pytest.mark.parametrize(
    "usage",
    [
        b'{"prompt_tokens": 100000000000000000000000000000, "completion_tokens": -1}',  # 10**30
        b'{"prompt_tokens": 9223372036854775808, "completion_tokens": 2147483648}',  # 2**63, 2**31
        b'{"prompt_tokens": "abc", "completion_tokens": [3]}',
        b'{"prompt_tokens": NaN, "completion_tokens": 2.5}',
        b'{"prompt_tokens": Infinity, "completion_tokens": 1e400}',
        b'"many"',
    ],
)
def test_counts_that_are_no_non_negative_int_in_range_are_ignored(
    gateway_data: dict[str, Any], usage: bytes
) -> None:
    """Once a 500 (ValueError, OverflowError from int()) or, on PostgreSQL, a DataError for a count
    past the column; a negative one was booked as it was (SQLite) or refused (PostgreSQL)."""
    raw = sse(chunk("a", 7, 1)).removesuffix(b"data: [DONE]\n\n")
    raw += with_usage(usage, b'[{"index": 0, "delta": {"content": "b"}}]') + with_usage(usage)
    result = asyncio.run(
        call(stream_of(raw + b"data: [DONE]\n\n"), "/v1/chat/completions", STREAM, gateway_data["secret"])
    )
    assert result.status == 200 and result.events()[-1] == "[DONE]"
    assert booked() == ("completed", 7, 1)


def test_counts_summed_over_choices_are_clamped_to_the_columns(gateway_data: dict[str, Any]) -> None:
    big = 2**31 - 1
    raw = b"".join(
        with_usage(
            json.dumps({"prompt_tokens": big, "completion_tokens": big}).encode(),
            json.dumps([{"index": i, "delta": {"content": "x"}}]).encode(),
        )
        for i in range(3)
    )
    body = {**STREAM, "n": 3}
    asyncio.run(
        call(stream_of(raw + b"data: [DONE]\n\n"), "/v1/chat/completions", body, gateway_data["secret"])
    )
    assert booked() == ("completed", big, big)


def test_garbage_events_are_dropped_and_the_client_gets_only_data_events(
    gateway_data: dict[str, Any],
) -> None:
    """Comments, other fields, no JSON, invalid UTF-8, JSON that is no object, NaN, 1e400 (relayed as
    Infinity, which no client parses) and nesting past the recursion limit (once a RecursionError
    out of the app) were passed on or raised."""
    garbage = [
        b": ping",
        b"event: x",
        b"garbage",
        b"data: \xff\xfe",
        b"data: [1, 2]",
        b'data: {"choices": [], "x": NaN}',
        b'data: {"choices": [{"index": 0, "delta": {"content": "z"}, "logprobs": 1e400}]}',  # was Infinity
        b"data: " + b"[" * 100_000,
        b'data: {"choices": [{"index": 0, "delta": {"content": "\\ud800"}}]}',  # a lone surrogate
    ]
    raw = b"".join(g + b"\n\n" for g in garbage) + sse(chunk("a", 7, 1), final_usage(7, 1))
    result = asyncio.run(call(stream_of(raw), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    events = result.events()
    assert events[0] == '{"choices":[{"index":0,"delta":{"content":"\\ud800"}}]}'
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == "a" and events[2:] == ["[DONE]"]
    assert booked() == ("completed", 7, 1)


def test_crlf_line_endings_split_anywhere_are_events_too(gateway_data: dict[str, Any]) -> None:
    raw = sse(chunk("a", 7, 1), final_usage(7, 2)).replace(b"\n", b"\r\n")
    pieces = [raw[i : i + 3] for i in range(0, len(raw), 3)]  # a CR and its LF in two pieces
    result = asyncio.run(call(stream_of(*pieces), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert json.loads(result.events()[0])["choices"][0]["delta"]["content"] == "a"
    assert result.events()[-1] == "[DONE]" and booked() == ("completed", 7, 2)


def test_a_compressed_stream_is_decoded_though_the_engine_was_asked_for_none(
    gateway_data: dict[str, Any],
) -> None:
    """The gateway's requests accepted gzip and deflate (httpx's default), which an engine behind a
    compressing proxy used; the stream was read raw, compressed, as if it were SSE: the client got
    an "ended early" error in place of the answer, and nothing was booked. The engine is now asked
    for no encoding (a compressed piece could decode far past the size limits), and one that
    compresses all the same is decoded."""
    raw = sse(chunk("a", 7, 1), final_usage(7, 2))
    compressed = gzip.compress(raw)
    pieces = [compressed[i : i + 5] for i in range(0, len(compressed), 5)]
    asked: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    def upstream(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers["accept-encoding"])
        headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
        return httpx.Response(200, content=body(), headers=headers)

    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert asked == ["identity"]
    assert json.loads(result.events()[0])["choices"][0]["delta"]["content"] == "a"
    assert result.events()[-1] == "[DONE]" and booked() == ("completed", 7, 2)


@pytest.mark.parametrize("newline", [b"\r", b"\r\n"])
def test_an_event_whose_piece_ends_in_a_cr_is_passed_on_without_waiting_for_the_next(newline: bytes) -> None:
    """Once a CR that ended a piece was held until the next piece showed whether an LF followed:
    an engine with CR line endings had every event (its token) held until it sent the next one, and
    one with CRLF had an event held whose piece broke between its last CR and LF."""
    meter = StreamMeter(started=0.0)
    first, second = (b"data: " + json.dumps(chunk(text, 7, n)).encode() for text, n in (("a", 1), ("b", 2)))
    events = meter.feed(first + newline + b"\r")  # the engine now generates the next token
    assert [json.loads(e.removeprefix(b"data: "))["choices"][0]["delta"]["content"] for e in events] == ["a"]
    rest = newline.removeprefix(b"\r")  # the LF of a CRLF comes with the next piece: no blank line
    events = meter.feed(rest + second + newline * 2 + b"data: [DONE]" + newline * 2)
    assert len(events) == 2 and events[-1] == b"data: [DONE]\n\n" and meter.completion_tokens == 2


def test_a_stream_that_ends_without_done_ends_with_an_error_event_and_failed(
    gateway_data: dict[str, Any],
) -> None:
    """Once the client's stream just stopped (no [DONE], no error) and the request was "completed"."""
    raw = sse(chunk("a", 7, 1)).removesuffix(b"data: [DONE]\n\n") + b'data: {"id": "c1", "choices": []'
    result = asyncio.run(call(stream_of(raw), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    last = json.loads(result.events()[-1])
    assert last["error"]["code"] == "upstream_failed" and "early" in last["error"]["message"]
    assert booked() == ("failed", 7, 1)


def test_a_last_event_without_its_blank_line_still_counts(gateway_data: dict[str, Any]) -> None:
    raw = sse(chunk("a", 7, 1)).removesuffix(b"\n\n")
    result = asyncio.run(call(stream_of(raw), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert result.events()[-1] == "[DONE]" and booked() == ("completed", 7, 1)


def test_nothing_after_done_is_passed_on(gateway_data: dict[str, Any]) -> None:
    raw = sse(chunk("a", 7, 1)) + sse(chunk("b", 7, 2))
    result = asyncio.run(call(stream_of(raw), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert len(result.events()) == 2 and result.events()[-1] == "[DONE]"
    assert booked() == ("completed", 7, 1)


def test_an_error_event_whose_error_is_no_object_still_fails_the_request(
    gateway_data: dict[str, Any],
) -> None:
    raw = b'data: {"error": "boom"}\n\ndata: [DONE]\n\n'
    result = asyncio.run(call(stream_of(raw), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert json.loads(result.events()[0])["error"]["type"] == "server_error"
    assert booked()[0] == "failed"


@pytest.mark.parametrize(
    ("status", "content", "ctype"),
    [
        (200, b"<html>oops</html>", "text/html"),
        (200, b"[1, 2]", "application/json"),
        (200, b'{"choices": [], "usage": {"prompt_tokens": NaN}}', "application/json"),
        (204, b"", "application/json"),
        (302, b"{}", "application/json"),
    ],
)
def test_a_non_streamed_answer_that_is_no_json_object_is_a_502_recorded_as_failed(
    gateway_data: dict[str, Any], status: int, content: bytes, ctype: str
) -> None:
    """Once relayed to the client as it was (the engine's status and content type)."""
    app = app_with(lambda request: httpx.Response(status, content=content, headers={"content-type": ctype}))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 502 and result.json()["error"]["code"] == "upstream_failed"
    assert booked() == ("failed", 0, 0)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"message": "KV cache exhausted", "type": "InternalServerError", "code": 503}, 503),
        ({"message": "KV cache exhausted", "code": "oops"}, 500),
        ("KV cache exhausted", 500),
    ],
)
def test_a_non_streamed_200_that_carries_an_error_is_that_error_recorded_as_failed(
    gateway_data: dict[str, Any], error: Any, status: int
) -> None:
    """Once relayed as a 200 and booked completed: a client reading it as a completion found none."""
    app = app_with(lambda request: httpx.Response(200, json={"error": error}))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == status, result.body
    body = result.json()["error"]
    assert body["type"] == "server_error"
    if isinstance(error, dict):
        assert body["message"] == "KV cache exhausted"
    assert booked()[0] == "failed"


def test_a_non_streamed_answer_with_wrong_typed_usage_is_relayed_and_booked_without_it(
    gateway_data: dict[str, Any],
) -> None:
    body = {"id": "c1", "choices": [], "usage": {"prompt_tokens": -5, "completion_tokens": 10**30}}
    app = app_with(lambda request: httpx.Response(200, json=body, headers={"content-type": "text/plain"}))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 200 and result.json() == body
    assert result.headers[b"content-type"] == b"application/json"
    assert booked() == ("completed", 0, 0)


def test_a_huge_line_in_many_pieces_is_buffered_in_linear_time() -> None:
    """Once every piece rescanned (and copied) all that was buffered: a 50 MB line in 64 KB pieces
    held the event loop for 43 s. 20 MB in 16 KB pieces took about 0.2 s since (25 s
    before); the bound is generous for a shared machine."""
    meter = StreamMeter(started=0.0)
    piece, started = b"x" * 16_384, time.perf_counter()
    assert meter.feed(b'data: {"id": "c1", "choices": [], "pad": "') == []
    for _ in range(1280):
        assert meter.feed(piece) == []
    events = meter.feed(b'"}\r\n\r\n')
    assert time.perf_counter() - started < 5
    assert len(events) == 1 and len(events[0]) > 20_000_000


@pytest.mark.parametrize("split", [0, 1, 2, 3, 4])
def test_a_byte_order_mark_before_the_first_event_is_ignored(
    gateway_data: dict[str, Any], split: int
) -> None:
    """Once the BOM made the first line no "data:" line: the first event (the first token) was
    dropped. SSE ignores one BOM at the stream's start, wherever the network splits it."""
    raw = b"\xef\xbb\xbf" + sse(chunk("a", 7, 1), chunk("b", 7, 2), final_usage(7, 2))
    result = asyncio.run(
        call(stream_of(raw[:split], raw[split:]), "/v1/chat/completions", STREAM, gateway_data["secret"])
    )
    texts = [json.loads(e)["choices"][0]["delta"]["content"] for e in result.events()[:-1]]
    assert texts == ["a", "b"] and result.events()[-1] == "[DONE]"
    assert booked() == ("completed", 7, 2)


def test_a_byte_order_mark_later_in_the_stream_is_no_event_start() -> None:
    """Only the stream's first bytes may be a BOM: one before a later event still spoils that line."""
    meter = StreamMeter(started=0.0)
    first = b"data: " + json.dumps(chunk("a", 7, 1)).encode() + b"\n\n"
    assert len(meter.feed(first)) == 1
    assert meter.feed(b"\xef\xbb\xbf" + first) == []


def whole_answer(body: dict[str, Any], status: int = 200) -> Any:
    """An app whose engine answers every request, a stream's too, with ``body`` as one JSON body."""
    return app_with(lambda request: httpx.Response(status, json=body))


CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hi there",
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_answered_with_one_json_completion_is_streamed_to_the_client(
    gateway_data: dict[str, Any], include_usage: bool
) -> None:
    """Once the client got "The engine ... ended its stream early" for an engine that answered a
    streamed request with its whole answer (vLLM behind a proxy that drops "stream"), and the
    request was booked failed with no tokens. The answer is now streamed as the client asked."""
    body = {**STREAM, "stream_options": {"include_usage": include_usage}}
    result = asyncio.run(
        call(whole_answer(CHAT_ANSWER), "/v1/chat/completions", body, gateway_data["secret"])
    )
    assert result.status == 200 and result.headers[b"content-type"].startswith(b"text/event-stream")
    events = result.events()
    assert events[-1] == "[DONE]"
    first = json.loads(events[0])
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-1"
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": "Hi there", "tool_calls": []},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    if include_usage:
        assert first["usage"] is None
        assert json.loads(events[1]) == {**first, "choices": [], "usage": CHAT_ANSWER["usage"]}
    assert len(events) == 2 + include_usage
    assert booked() == ("completed", 7, 3)


def test_a_legacy_stream_answered_with_one_json_completion_is_streamed_with_tool_call_indexes(
    gateway_data: dict[str, Any],
) -> None:
    answer = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "tiny",
        "choices": [
            {"index": i, "text": t, "logprobs": None, "finish_reason": "length"} for i, t in enumerate("ab")
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8},
    }
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "n": 2, "stream": True}
    result = asyncio.run(call(whole_answer(answer), "/v1/completions", body, gateway_data["secret"]))
    first, done = result.events()
    assert json.loads(first) == {k: v for k, v in answer.items() if k != "usage"} and done == "[DONE]"
    assert booked() == ("completed", 2, 6)

    call_ = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call_, {**call_, "id": "t2"}]}
    answer = {**CHAT_ANSWER, "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    result = asyncio.run(call(whole_answer(answer), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    delta = json.loads(result.events()[0])["choices"][0]["delta"]
    assert delta["tool_calls"] == [{"index": 0, **call_}, {"index": 1, **call_, "id": "t2"}]


def test_a_400_in_one_json_body_to_a_stream_is_the_engines_error_before_any_event(
    gateway_data: dict[str, Any],
) -> None:
    answer = {"error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}}
    result = asyncio.run(
        call(whole_answer(answer, 400), "/v1/chat/completions", STREAM, gateway_data["secret"])
    )
    assert result.status == 400 and result.json()["error"]["message"] == "too long"
    assert booked() == ("failed", 0, 0)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ({"error": {"message": "boom", "code": 500}}, {"message": "boom", "code": None}),
        (
            {"id": "c1", "object": "chat.completion"},  # no choices: no completion
            {"message": "The engine serving this request ended its stream early.", "code": "upstream_failed"},
        ),
    ],
)
def test_a_stream_answered_with_one_json_object_that_is_no_completion_ends_with_one_error(
    gateway_data: dict[str, Any], answer: dict[str, Any], error: dict[str, Any]
) -> None:
    """An engine's error object is its error event (no more); any other object no stream at all."""
    result = asyncio.run(call(whole_answer(answer), "/v1/chat/completions", STREAM, gateway_data["secret"]))
    assert result.status == 200 and result.ended.is_set()
    (event,) = result.events()
    assert json.loads(event) == {"error": {**error, "type": "server_error", "param": None}}
    assert booked() == ("failed", 0, 0)
