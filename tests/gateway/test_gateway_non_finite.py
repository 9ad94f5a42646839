"""Non-finite numbers (NaN, Infinity, -Infinity, 1e400) in a /v1 body: a 400 in OpenAI's shape,
and nothing reaches the engine (forwarded, they would make its body invalid JSON)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from gateway.errors import GatewayError
from gateway.models import Usage
from gateway.validation import parse_body

from tests.gateway.asgi_driver import CHAT, app_with, call, never

NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"]
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 3}


def with_field(body: dict[str, Any], name: str, literal: bytes) -> bytes:
    """``body`` as JSON with ``"name": literal`` added (``literal`` written as it is)."""
    return json.dumps(body).encode()[:-1] + b', "' + name.encode() + b'": ' + literal + b"}"


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", CHAT, "temperature"),  # a field the gateway checks the type of
        ("/v1/chat/completions", CHAT, "min_p"),  # one it passes on unchecked
        ("/v1/completions", COMPLETION, "top_p"),
    ],
)
def test_a_non_finite_top_level_number_is_a_400_naming_the_field(
    gateway_data: dict[str, Any], literal: bytes, path: str, body: dict[str, Any], field: str
) -> None:
    raw = with_field(body, field, literal)
    result = asyncio.run(call(app_with(never), path, raw, gateway_data["secret"]))  # never: no upstream
    assert result.status == 400 and result.headers[b"content-type"] == b"application/json"
    error = result.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", field)
    assert "finite" in error["message"]
    assert not Usage.objects.exists()


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize(
    ("field", "template"),
    [
        ("logit_bias", b'{"50256": %s}'),
        ("messages", b'[{"role": "user", "content": [{"type": "text", "text": "hi", "w": [1, %s]}]}]'),
        ("response_format", b'{"type": "json_schema", "json_schema": {"schema": {"maximum": %s}}}'),
    ],
)
def test_a_nested_non_finite_number_is_a_400_saying_the_body_has_one(
    gateway_data: dict[str, Any], literal: bytes, field: str, template: bytes
) -> None:
    raw = with_field({k: v for k, v in CHAT.items() if k != field}, field, template % literal)
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", raw, gateway_data["secret"]))
    assert result.status == 400
    error = result.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] is None
    assert "non-finite number" in error["message"] and f"'{field}'" in error["message"]
    assert not Usage.objects.exists()


def test_finite_numbers_at_the_edge_of_a_float_are_accepted() -> None:
    raw = b'{"model": "tiny", "temperature": 1.7976931348623157e308, "x": [[-1e308, 5e-324, 0, -0.0]]}'
    body = parse_body(raw)
    assert body["temperature"] == 1.7976931348623157e308 and body["x"] == [[-1e308, 5e-324, 0, 0.0]]
    json.dumps(body, allow_nan=False)  # what is forwarded stays valid JSON


@pytest.mark.parametrize("literal", NON_FINITE)
def test_the_parser_refuses_a_non_finite_number_at_any_depth(literal: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_body(b'{"a": {"b": [' + literal + b"]}}")
    assert caught.value.status == 400 and "'a'" in caught.value.message
