"""Bad bodies to /v1/chat/completions and /v1/completions are JSON 4xx answers, never a 500.

Hypothesis sends arbitrary JSON, bytes that are no JSON, and the minimal valid request with some of
its fields given wrong-typed or out-of-range values, through the ASGI app against a stand-in engine
that answers every request it is sent (so a 5xx can only be the gateway's own). A 4xx records no
usage, no request sample and leaves no token reservation behind.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from django.db.models import Model
from gateway.models import RequestSample, TokenReservation, Usage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.asgi_driver import app_with, call, chunk, final_usage, sse

PATHS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "tiny", "prompt": "hi"},
}
# Fields of OpenAI's requests (and vLLM's extras) the wrong values go into; unknown ones pass through.
FIELDS = (
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "n", "stream", "stream_options", "stop", "seed", "logit_bias", "logprobs", "top_logprobs",
    "response_format", "ignore_eos", "presence_penalty", "frequency_penalty", "user", "echo", "suffix",
)  # fmt: skip
TABLES: tuple[type[Model], ...] = (Usage, RequestSample, TokenReservation)

BIG = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1, -(10**30), 10**400])
ODD_FLOAT = st.sampled_from([1e308, -1e308, 5e-324, -0.0, 0.5, -1.5])
TEXT = st.one_of(st.text(max_size=20), st.sampled_from(["x" * 10_000, "\U0001f600" * 300, "\x00", ""]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), BIG, ODD_FLOAT, TEXT)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def shaped(draw: st.DrawFn, valid: dict[str, Any]) -> dict[str, Any]:
    body = dict(valid)
    for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True)):
        body[name] = draw(JSON_VALUES)
    return body


def engine(request: httpx.Request) -> httpx.Response:
    """Answers any request as vLLM answers a valid one (streamed when asked to)."""
    sent = json.loads(request.content)
    if sent.get("stream") is True:
        body = sse(chunk("a", 3, 1), final_usage(3, 1))  # a stream: content= would be read up front
        return httpx.Response(
            200, stream=httpx.ByteStream(body), headers={"content-type": "text/event-stream"}
        )
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "a"},
        "text": "a",
        "finish_reason": "stop",
    }
    return httpx.Response(
        200, json={"id": "c1", "object": "x", "model": "tiny", "choices": [choice], "usage": usage}
    )


def _counts() -> dict[str, int]:
    return {table.__name__: table._default_manager.count() for table in TABLES}


@settings(
    max_examples=60,
    deadline=None,
    # gateway_data's rows are only read; each example compares the counts around its own request.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_bad_bodies_are_json_4xx_answers_that_record_nothing(gateway_data: dict[str, Any], data: Any) -> None:
    key = gateway_data["key"]
    key.requests_per_minute, key.tokens_per_day = 2**31 - 1, 2**62  # no quota answers in the way
    key.save(update_fields=["requests_per_minute", "tokens_per_day"])
    path = data.draw(st.sampled_from(sorted(PATHS)), label="path")
    body: bytes = data.draw(
        st.one_of(
            JSON_VALUES.map(lambda value: json.dumps(value).encode()),
            shaped(PATHS[path]).map(lambda value: json.dumps(value).encode()),
            st.binary(max_size=50),
        ),
        label="body",
    )
    before = _counts()
    result = asyncio.run(call(app_with(engine), path, body, gateway_data["secret"]))
    assert result.status is not None and result.status < 500, (result.status, body[:300], result.body[:300])
    if 400 <= result.status < 500:
        assert result.headers[b"content-type"] == b"application/json"
        assert "error" in result.json()
        assert _counts() == before, f"{result.status} for {body[:300]!r} but recorded rows"
