"""Request bodies the gateway must refuse with a 400 naming the field, and ones it must accept."""

from __future__ import annotations

from typing import Any

import pytest
from gateway.errors import GatewayError
from gateway.validation import MAX_JSON_DEPTH, parse_body, validate

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "tiny", "prompt": "hi"}


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", {"model": "tiny"}, "messages"),
        ("chat", {**CHAT, "messages": []}, "messages"),
        ("chat", {**CHAT, "messages": ["hi"]}, "messages"),
        ("chat", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ("chat", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages"),
        ("chat", {"messages": CHAT["messages"]}, "model"),
        ("chat", {**CHAT, "model": 3}, "model"),
        # No model's name; looking it up was a 500 on PostgreSQL (text cannot hold NUL).
        ("completion", {**COMPLETION, "model": "tiny\x00"}, "model"),
        ("chat", {**CHAT, "max_tokens": 0}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": -4}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": "10"}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": True}, "max_tokens"),
        ("chat", {**CHAT, "max_completion_tokens": 1.5}, "max_completion_tokens"),
        ("chat", {**CHAT, "temperature": "hot"}, "temperature"),
        ("chat", {**CHAT, "n": 0}, "n"),
        ("chat", {**CHAT, "stream": "yes"}, "stream"),
        ("chat", {**CHAT, "stop": [1, 2]}, "stop"),
        ("chat", {**CHAT, "seed": 1.5}, "seed"),
        # Past a signed 64-bit integer: vLLM answers top_k >= 2**64 with a 500, which the gateway
        # took for a failed replica (every replica tried and penalised, then a 503 "retry later").
        ("chat", {**CHAT, "top_k": 2**64}, "top_k"),
        ("chat", {**CHAT, "seed": 2**63}, "seed"),
        ("completion", {**COMPLETION, "seed": -(2**63) - 1}, "seed"),
        ("chat", {**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ("chat", {**CHAT, "stream": True, "stream_options": {"include_usage": "y"}}, "stream_options"),
        ("completion", {"model": "tiny"}, "prompt"),
        ("completion", {**COMPLETION, "prompt": ""}, "prompt"),
        ("completion", {**COMPLETION, "prompt": [1, "a"]}, "prompt"),
        ("completion", {**COMPLETION, "prompt": {"text": "hi"}}, "prompt"),
    ],
)
def test_it_rejects_bad_bodies_naming_the_field(kind: str, body: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        validate(kind, body)
    assert caught.value.status == 400 and caught.value.param == param
    assert caught.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("chat", {**CHAT, "max_tokens": 5, "temperature": 0, "stop": ["\n"], "top_k": 5, "ignore_eos": True}),
        ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        ("completion", {**COMPLETION, "prompt": [1, 2, 3], "stream": True}),
        ("completion", {**COMPLETION, "prompt": [[1, 2], [3]]}),
        ("completion", {**COMPLETION, "seed": 2**63 - 1, "top_k": -1}),
        ("chat", {**CHAT, "seed": -(2**63)}),
        ("completion", {**COMPLETION, "prompt": ["a", "b"], "stream": True, "stream_options": {}}),
    ],
)
def test_it_accepts_valid_bodies_and_passes_extra_fields_on(kind: str, body: dict[str, Any]) -> None:
    request = validate(kind, body)
    assert request.model == "tiny" and request.body is body and request.kind == kind


def test_it_reads_stream_and_include_usage() -> None:
    request = validate("chat", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert request.stream and request.include_usage
    assert not validate("chat", {**CHAT, "stream": True}).include_usage


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_it_rejects_bodies_that_are_not_json_objects(raw: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_body(raw)
    assert caught.value.status == 400


def nested_lists(depth: int) -> bytes:
    """A JSON object whose field "x" holds lists: ``depth`` containers deep in all."""
    return b'{"x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def nested_objects(depth: int) -> bytes:
    return b'{"a": ' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize("raw", [nested_lists(MAX_JSON_DEPTH), nested_objects(MAX_JSON_DEPTH)])
def test_it_accepts_nesting_up_to_the_limit(raw: bytes) -> None:
    assert parse_body(raw)


@pytest.mark.parametrize(
    "raw",
    [
        nested_lists(MAX_JSON_DEPTH + 1),
        nested_objects(MAX_JSON_DEPTH + 1),
        b"[" * 1100 + b"]" * 1100,  # past Python's recursion limit: json.loads raises RecursionError
        b'{"a":' * 1100 + b"1" + b"}" * 1100,
    ],
)
def test_it_rejects_bodies_nested_too_deeply(raw: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_body(raw)
    assert caught.value.status == 400 and "nested too deeply" in caught.value.message
