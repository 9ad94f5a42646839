"""The gateway as the official ``openai`` SDK sees it (fast: a stand-in engine, the app in-process):
each refusal is the SDK's exception class with OpenAI's ``code``, ``type`` and ``param``; the SDK's
automatic retries follow our headers; streams parse into its chunk types."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from accounts.services import create_api_key, revoke_api_key
from gateway.services import record_usage
from gateway.validation import MAX_BODY_BYTES
from inventory.models import HostStatus

from tests.gateway.asgi_driver import app_with, sse
from tests.gateway.openai_driver import Counted, engine, openai_client

pytestmark = pytest.mark.usefixtures("gateway_data")

MESSAGES: Any = [{"role": "user", "content": "hi"}]
Call = Callable[[openai.AsyncOpenAI], Coroutine[Any, Any, Any]]


def chat(**fields: Any) -> Call:
    """A chat completion request to "tiny" with ``fields`` (over the defaults) through the SDK."""
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, **fields}
    return lambda client: client.chat.completions.create(**body)


def refused(app: Any, secret: str, request: Call, max_retries: int = 0) -> openai.APIError:
    async def send() -> openai.APIError:
        with pytest.raises(openai.APIError) as caught:
            result = await request(openai_client(app, secret, max_retries))
            if isinstance(result, openai.AsyncStream):
                [_ async for _ in result]
        return caught.value

    return asyncio.run(send())


def engine_refusal(request: httpx.Request) -> httpx.Response:
    error = {
        "message": "max_tokens is too large",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }
    return httpx.Response(400, json={"error": error})


def engine_dies(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        500, json={"error": {"message": "dead", "type": "InternalServerError", "code": 500}}
    )


def key(gateway_data: dict[str, Any], **quotas: int) -> str:
    return create_api_key(gateway_data["user"], "sdk", **quotas).plaintext


def used_up(gateway_data: dict[str, Any]) -> str:
    record_usage(gateway_data["key"].pk, gateway_data["model"].pk, 10_000, 0)  # the key's whole day
    return str(gateway_data["secret"])


def revoked(gateway_data: dict[str, Any]) -> str:
    revoke_api_key(gateway_data["key"])
    return str(gateway_data["secret"])


def no_replica(gateway_data: dict[str, Any]) -> str:
    gateway_data["host"].status = HostStatus.OFFLINE
    gateway_data["host"].save()
    return str(gateway_data["secret"])


def rate_limited(gateway_data: dict[str, Any]) -> str:
    secret = key(gateway_data, requests_per_minute=1)
    asyncio.run(chat()(openai_client(app_with(engine), secret)))  # the minute's one request
    return secret


def own_key(gateway_data: dict[str, Any]) -> str:
    return str(gateway_data["secret"])


@dataclass(frozen=True)
class Refusal:
    """What the SDK raises (``kind`` and its fields) for ``request`` with the key ``setup`` gives."""

    kind: type[openai.APIStatusError]
    status: int
    code: str | None
    type: str = "invalid_request_error"
    param: str | None = None
    setup: Callable[[dict[str, Any]], str] = own_key
    upstream: Callable[[httpx.Request], httpx.Response] = engine
    request: Call | None = None  # None: a plain chat


BIG = [{"role": "user", "content": "x" * MAX_BODY_BYTES}]
LIMITED = "rate_limit_error"
REFUSALS = {
    "bad key": Refusal(openai.AuthenticationError, 401, "invalid_api_key", setup=lambda d: "sk-wrong"),
    "revoked key": Refusal(openai.AuthenticationError, 401, "invalid_api_key", setup=revoked),
    "unknown model": Refusal(
        openai.NotFoundError, 404, "model_not_found", param="model", request=chat(model="x")
    ),
    "no healthy replica": Refusal(
        openai.InternalServerError, 503, "no_healthy_replica", "service_unavailable", setup=no_replica
    ),
    "rate limit": Refusal(openai.RateLimitError, 429, "rate_limit_exceeded", LIMITED, setup=rate_limited),
    "daily quota": Refusal(openai.RateLimitError, 429, "tokens_quota_exceeded", LIMITED, setup=used_up),
    "request too large": Refusal(
        openai.BadRequestError,
        400,
        "request_too_large",
        param="max_tokens",
        request=chat(n=50, max_tokens=250),
    ),
    "wrong type": Refusal(
        openai.BadRequestError, 400, None, param="temperature", request=chat(temperature="hot")
    ),
    "body too large": Refusal(openai.APIStatusError, 413, "body_too_large", request=chat(messages=BIG)),
    "engine 4xx": Refusal(openai.BadRequestError, 400, None, param="max_tokens", upstream=engine_refusal),
    "every replica 5xx": Refusal(
        openai.InternalServerError, 503, "upstream_failed", "service_unavailable", upstream=engine_dies
    ),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_each_refusal_is_the_sdks_exception_with_openais_fields(
    gateway_data: dict[str, Any], name: str
) -> None:
    case = REFUSALS[name]
    error = refused(app_with(case.upstream), case.setup(gateway_data), case.request or chat())
    assert type(error) is case.kind and isinstance(error, openai.APIStatusError)
    assert (error.status_code, error.code, error.type, error.param) == (
        case.status,
        case.code,
        case.type,
        case.param,
    )
    assert isinstance(error.body, dict) and error.body["message"]
    assert error.message.endswith(error.body["message"])


def test_the_sdk_does_not_retry_a_refusal_a_retry_would_repeat(gateway_data: dict[str, Any]) -> None:
    """Its default policy retries 429 and 5xx, twice, not 4xx; a 429 whose Retry-After is past
    its limit (two minutes: the daily quota's is until midnight) is not retried either, and it
    does not wait."""
    for setup, request in [
        (own_key, chat(temperature="hot")),
        (own_key, chat(model="gpt-9")),
        (own_key, chat(messages=BIG)),
        (used_up, chat()),
    ]:
        app = Counted(app_with(engine))
        started = time.monotonic()
        error = refused(app, setup(gateway_data), request, max_retries=2)
        assert isinstance(error, openai.APIStatusError) and app.requests == 1, error
        assert time.monotonic() - started < 2
        if error.status_code == 429:
            assert int(error.response.headers["retry-after"]) > 120


def test_an_answer_too_large_to_relay_is_not_retried_by_the_sdk(
    gateway_data: dict[str, Any], settings: Any
) -> None:
    """The SDK retries a 502; the same request would make an engine generate the same oversized
    answer again (twice, by default), to be cut off again."""
    settings.GATEWAY_MAX_ENGINE_BODY_BYTES = 1000
    asked: list[httpx.Request] = []

    def huge(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json={"id": "c1", "choices": [], "pad": "x" * 2000})

    error = refused(app_with(huge), gateway_data["secret"], chat(), max_retries=2)
    assert isinstance(error, openai.InternalServerError) and error.status_code == 502
    assert error.code == "upstream_failed" and "(1000 bytes)" in error.message
    assert len(asked) == 1, "the SDK retried"
    assert error.response.headers["x-should-retry"] == "false"


def answering(body: bytes) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(200, stream=httpx.ByteStream(body))


def test_an_error_mid_stream_is_raised_by_the_sdks_stream(gateway_data: dict[str, Any]) -> None:
    """The gateway's own (the engine's stream broke off) and the engine's error event alike."""
    first = sse(
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}
    )
    cut = first.removesuffix(b"data: [DONE]\n\n")
    failing = (
        cut + b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n'
    )
    for body, code, message in [
        (cut, "upstream_failed", "ended its stream early"),
        (failing + b"data: [DONE]\n\n", None, "engine died"),
    ]:
        error = refused(app_with(answering(body)), gateway_data["secret"], chat(stream=True))
        assert type(error) is openai.APIError and (error.code, error.type) == (code, "server_error")
        assert message in error.message


def test_streams_parse_into_the_sdks_chunks_with_the_usage_asked_for(gateway_data: dict[str, Any]) -> None:
    async def stream(client: openai.AsyncOpenAI) -> tuple[list[Any], list[Any]]:
        chat = await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            n=2,
            max_completion_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        completions = await client.completions.create(
            model="tiny", prompt=["a", "b"], n=2, max_tokens=3, stream=True
        )
        return [c async for c in chat], [c async for c in completions]

    chat, completions = asyncio.run(stream(openai_client(app_with(engine), gateway_data["secret"])))
    assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chat)
    assert [c.choices[0].index for c in chat[:-1]] == [0, 1] and all(c.usage is None for c in chat[:-1])
    assert chat[-1].choices == [] and chat[-1].usage is not None and chat[-1].usage.completion_tokens == 2
    assert all(isinstance(c, openai.types.Completion) for c in completions)
    assert [c.choices[0].index for c in completions] == [0, 1, 2, 3], "no usage chunk: none asked for"
    assert all(c.usage is None for c in completions)


def test_models_and_rate_limit_headers_read_as_the_sdk_expects(gateway_data: dict[str, Any]) -> None:
    async def read(client: openai.AsyncOpenAI) -> tuple[Any, Any, Any]:
        listed = await client.models.list()
        one = await client.models.retrieve("tiny")
        raw = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=3
        )
        return listed, one, raw

    listed, one, raw = asyncio.run(read(openai_client(app_with(engine), gateway_data["secret"])))
    assert [m.model_dump() for m in listed.data] == [one.model_dump()]
    assert (one.id, one.object, one.owned_by) == ("tiny", "model", "platform") and one.created > 0
    assert raw.parse().choices[0].message.content == "hi"
    limits = {
        name: raw.headers[f"x-ratelimit-{name}"]
        for name in (
            "limit-requests",
            "remaining-requests",
            "reset-requests",
            "limit-tokens",
            "remaining-tokens",
            "reset-tokens",
        )
    }
    assert (limits["limit-requests"], limits["remaining-requests"]) == ("100", "99")
    assert limits["limit-tokens"] == "10000" and 0 < int(limits["remaining-tokens"]) < 10_000
    for reset in (limits["reset-requests"], limits["reset-tokens"]):
        assert re.fullmatch(r"(\d+h)?(\d+m)?\d+s", reset), reset


def test_every_answer_has_a_request_id_the_engine_was_given_too(gateway_data: dict[str, Any]) -> None:
    """The SDK shows ``x-request-id`` as a response's ``request_id`` and an error's; the engine
    got the same id as X-Request-Id (vLLM names its request after it)."""
    given: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        given.append(request.headers["x-request-id"])
        return engine(request)

    async def answers(client: openai.AsyncOpenAI) -> list[str | None]:
        ids = []
        for _ in range(2):
            raw = await client.chat.completions.with_raw_response.create(
                model="tiny", messages=MESSAGES, max_tokens=3
            )
            ids.append(raw.request_id)
        ids.append((await client.models.with_raw_response.list()).request_id)
        return ids

    ids = asyncio.run(answers(openai_client(app_with(upstream), gateway_data["secret"])))
    assert all(re.fullmatch(r"req_[0-9a-f]{32}", str(i)) for i in ids) and len(set(ids)) == 3
    assert given == ids[:2]
    error = refused(app_with(upstream), gateway_data["secret"], chat(model="gpt-9"))
    assert isinstance(error, openai.NotFoundError) and error.request_id and error.request_id not in ids


def test_the_sdks_sampling_fields_and_extra_body_reach_the_engine_unchanged(
    gateway_data: dict[str, Any],
) -> None:
    seen: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return engine(request)

    fields: dict[str, Any] = {
        "n": 2,
        "stop": ["\n", "END"],
        "max_completion_tokens": 4,
        "logprobs": True,
        "top_logprobs": 2,
        "seed": 7,
        "user": "u-1",
        "response_format": {"type": "json_object"},
    }
    xargs = {"vllm_xargs": {"slo_ttft_ms": 200}, "top_k": 5}

    async def send(client: openai.AsyncOpenAI) -> None:
        await client.chat.completions.create(model="tiny", messages=MESSAGES, extra_body=xargs, **fields)
        stream = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, stream=True, extra_body=xargs, **fields
        )
        [_ async for _ in stream]

    asyncio.run(send(openai_client(app_with(upstream), gateway_data["secret"])))
    expected = {"model": "tiny", "messages": MESSAGES, **fields, **xargs}
    # ... with the key owner's prefix-cache salt added (gateway/cache_salt.py), the same for both.
    salts = {body.pop("cache_salt") for body in seen}
    assert len(salts) == 1 and re.fullmatch(r"[0-9a-f]{64}", salts.pop())
    assert seen[0] == expected
    usage_on_every_chunk = {"include_usage": True, "continuous_usage_stats": True}
    assert seen[1] == {**expected, "stream": True, "stream_options": usage_on_every_chunk}


def test_the_gateways_log_lines_about_a_request_name_its_request_id(
    gateway_data: dict[str, Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The id a user quotes from the SDK's error finds what the gateway logged about the request."""
    settings.GATEWAY_MAX_ENGINE_BODY_BYTES = 1000
    app = app_with(lambda request: httpx.Response(200, json={"pad": "x" * 2000}))
    errors = [refused(app, gateway_data["secret"], chat()) for _ in range(2)]
    ids = [e.request_id for e in errors if isinstance(e, openai.InternalServerError)]
    lines = [r.getMessage() for r in caplog.records if "answer over 1000 bytes" in r.getMessage()]
    assert len(ids) == len(lines) == 2 and ids[0] != ids[1]
    assert [f"[{i}]" in line for i, line in zip(ids, lines, strict=True)] == [True, True], lines
