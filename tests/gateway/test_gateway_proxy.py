"""The /v1 ASGI app against a STAND-IN upstream (httpx.MockTransport): auth, errors, streaming
rewrite, usage, failover and disconnect handling, without engines (fast unit tests)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from accounts.services import revoke_api_key
from gateway import relay
from gateway.models import RequestSample, Usage
from inventory.models import HostStatus
from registry.models import ServedModel

from tests.gateway.asgi_driver import CHAT, Call, app_with, call, chunk, final_usage, never, sse

pytestmark = pytest.mark.usefixtures("gateway_data")


@pytest.mark.parametrize("secret", [None, "sk-wrong"])
def test_it_answers_401_in_openai_format_without_a_valid_key(secret: str | None) -> None:
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", CHAT, secret))
    assert result.status == 401 and result.headers[b"content-type"] == b"application/json"
    error = result.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"


@pytest.mark.parametrize("body", [{}, {**CHAT, "max_tokens": 0}, None])  # None: an empty body
def test_it_asks_for_a_key_before_it_looks_at_the_body(body: Any) -> None:
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", body, None))
    assert result.status == 401 and result.json()["error"]["code"] == "invalid_api_key"


def test_a_revoked_key_is_refused(gateway_data: dict[str, Any]) -> None:
    revoke_api_key(gateway_data["key"])
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 401


def test_bad_bodies_unknown_models_and_paths_are_openai_errors(gateway_data: dict[str, Any]) -> None:
    secret, app = gateway_data["secret"], app_with(never)
    bad = asyncio.run(call(app, "/v1/chat/completions", {**CHAT, "max_tokens": 0}, secret))
    assert bad.status == 400 and bad.json()["error"]["param"] == "max_tokens"
    unknown = asyncio.run(call(app, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}, secret))
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert asyncio.run(call(app, "/v1/embeddings", {}, secret)).status == 404
    assert asyncio.run(call(app, "/v1/completions", None, secret, method="GET")).status == 405
    assert not Usage.objects.exists()


@pytest.mark.parametrize(
    ("path", "method", "allowed"),
    [
        ("/v1/chat/completions", "PUT", b"POST"),
        ("/v1/completions", "GET", b"POST"),
        ("/v1/models", "POST", b"GET, HEAD"),
        ("/v1/models/tiny", "DELETE", b"GET, HEAD"),
    ],
)
def test_a_405_names_the_allowed_method(
    gateway_data: dict[str, Any], path: str, method: str, allowed: bytes
) -> None:
    """RFC 9110: a 405 must carry Allow; it had none, so a client could not tell what to send."""
    result = asyncio.run(call(app_with(never), path, None, gateway_data["secret"], method=method))
    assert result.status == 405 and result.headers[b"allow"] == allowed
    assert result.json()["error"]["code"] == "method_not_allowed"


def test_no_healthy_replica_is_503_with_retry_after(gateway_data: dict[str, Any]) -> None:
    gateway_data["host"].status = HostStatus.OFFLINE
    gateway_data["host"].save()
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 503 and int(result.headers[b"retry-after"]) > 0
    assert result.json()["error"]["code"] == "no_healthy_replica"


def test_it_lists_served_models(gateway_data: dict[str, Any]) -> None:
    result = asyncio.run(call(app_with(never), "/v1/models", None, gateway_data["secret"], method="GET"))
    assert result.status == 200 and [m["id"] for m in result.json()["data"]] == ["tiny"]


def test_it_retrieves_a_served_model_as_the_list_shows_it(gateway_data: dict[str, Any]) -> None:
    ServedModel.objects.create(  # no deployment: not served
        name="idle", source="/m", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    app, secret = app_with(never), gateway_data["secret"]
    listed = asyncio.run(call(app, "/v1/models", None, secret, method="GET")).json()["data"]
    one = asyncio.run(call(app, "/v1/models/tiny", None, secret, method="GET"))
    assert one.status == 200 and [one.json()] == listed
    for name in ("idle", "gpt-9"):
        missing = asyncio.run(call(app, f"/v1/models/{name}", None, secret, method="GET"))
        assert missing.status == 404
        assert missing.json()["error"] == {
            "message": f"The model '{name}' does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    for wrong in (None, "sk-wrong"):
        refused = asyncio.run(call(app, "/v1/models/tiny", None, wrong, method="GET"))
        assert refused.status == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert asyncio.run(call(app, "/v1/models/tiny", {}, secret)).status == 405


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/tiny"])
def test_the_model_routes_answer_head_as_get_without_a_body(gateway_data: dict[str, Any], path: str) -> None:
    """RFC 9110: a GET resource answers HEAD; `HEAD /v1/models` with a valid key was a 405."""
    app, secret = app_with(never), gateway_data["secret"]
    got = asyncio.run(call(app, path, None, secret, method="GET"))
    head = asyncio.run(call(app, path, None, secret, method="HEAD"))
    assert (head.status, head.body) == (200, b"") and got.body
    assert {**head.headers, b"x-request-id": b""} == {**got.headers, b"x-request-id": b""}
    refused = asyncio.run(call(app, path, None, None, method="HEAD"))
    assert (refused.status, refused.body) == (401, b"")
    wrong = asyncio.run(call(app, "/v1/chat/completions", None, secret, method="HEAD"))
    assert (wrong.status, wrong.headers[b"allow"], wrong.body) == (405, b"POST", b"")


@pytest.mark.parametrize("include_usage", [True, False])
def test_it_streams_rewritten_chunks_and_records_usage(
    gateway_data: dict[str, Any], include_usage: bool
) -> None:
    seen: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        body = sse(chunk("a", 7, 1), chunk("b", 7, 2), final_usage(7, 2))
        return httpx.Response(
            200, stream=httpx.ByteStream(body), headers={"content-type": "text/event-stream"}
        )

    body = {**CHAT, "stream": True, "stream_options": {"include_usage": include_usage}}
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    assert result.status == 200 and result.headers[b"content-type"].startswith(b"text/event-stream")
    assert (
        result.headers[b"x-ratelimit-limit-requests"] == str(gateway_data["key"].requests_per_minute).encode()
    )
    assert b"x-ratelimit-remaining-tokens" in result.headers
    assert seen[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    events = result.events()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]] == ["a", "b"]
    if include_usage:
        assert [c["usage"] for c in chunks[:-1]] == [None, None]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    else:
        assert len(chunks) == 2 and all("usage" not in c for c in chunks)
    usage = Usage.objects.get(key=gateway_data["key"])
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (1, 7, 2)
    sample = RequestSample.objects.get()
    assert sample.outcome == "completed" and sample.stream and sample.ttft_s is not None
    assert sample.tbt_mean_s is not None


def test_it_fails_over_to_another_replica_before_the_first_byte(gateway_data: dict[str, Any]) -> None:
    tried: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        tried.append(request.url.host)
        if request.url.host == "replica-a":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "replica-b" and len(tried) == 2:
            return httpx.Response(
                200, json={"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
            )
        return httpx.Response(502, text="bad gateway")

    app = app_with(upstream)
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 200 and tried == ["replica-a", "replica-b"]
    sample = RequestSample.objects.get()
    assert sample.deployment_id == gateway_data["deployments"][1].pk and not sample.stream
    tried.clear()
    failed = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert tried == ["replica-b", "replica-a"], "the failed replica is tried last"
    assert failed.status == 503 and failed.json()["error"]["code"] == "upstream_failed"
    assert b"retry-after" in failed.headers
    assert Usage.objects.get().requests == 1, "a request no replica took is not counted"


@pytest.mark.parametrize(
    ("engine_body", "param"),
    [
        # vLLM 0.32's ErrorResponse (create_error_response): type a class name, code the status.
        (
            {
                "error": {
                    "message": "max_tokens too large",
                    "type": "BadRequestError",
                    "param": "max_tokens",
                    "code": 400,
                }
            },
            "max_tokens",
        ),
        # vLLM's HTTPException handler: the type is the status phrase.
        (
            {"error": {"message": "max_tokens too large", "type": "Bad Request", "param": None, "code": 400}},
            None,
        ),
        # Older vLLM: a flat object.
        (
            {
                "object": "error",
                "message": "max_tokens too large",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            None,
        ),
    ],
)
def test_an_engine_error_keeps_status_and_message_in_the_gateways_shape(
    gateway_data: dict[str, Any], engine_body: dict[str, Any], param: str | None
) -> None:
    app = app_with(lambda request: httpx.Response(400, json=engine_body))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 400 and result.headers[b"content-type"] == b"application/json"
    assert result.json() == {
        "error": {
            "message": "max_tokens too large",
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }
    assert RequestSample.objects.get().outcome == "failed"


def test_an_engine_error_that_is_not_json_still_gets_the_gateways_shape(gateway_data: dict[str, Any]) -> None:
    app = app_with(lambda request: httpx.Response(404, text="Not Found"))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 404
    assert result.json()["error"] == {
        "message": "The engine answered HTTP 404.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def nested_in_chat(depth: int) -> bytes:
    """A chat body with a list ``depth`` deep in a field the gateway passes on unchecked."""
    return json.dumps(CHAT).encode()[:-1] + b', "logit_bias": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 1100 + b"]" * 1100,  # json.loads itself gives up (RecursionError)
        b'{"a":' * 1100 + b"1" + b"}" * 1100,
        nested_in_chat(200),  # valid JSON, deeper than any real request
        nested_in_chat(900),  # json.loads takes it; json.dumps for the engine might not
    ],
)
def test_a_deeply_nested_body_is_a_400_in_openai_format(gateway_data: dict[str, Any], raw: bytes) -> None:
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", raw, gateway_data["secret"]))
    assert result.status == 400 and result.headers[b"content-type"] == b"application/json"
    assert "nested too deeply" in result.json()["error"]["message"]
    assert not Usage.objects.exists()


def test_a_disconnect_cancels_the_upstream_stream(gateway_data: dict[str, Any]) -> None:
    state = {"produced": 0, "closed": False}

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                state["produced"] += 1
                yield b"data: " + json.dumps(chunk("x", 5, state["produced"])).encode() + b"\n\n"
                await asyncio.sleep(0.01)
        finally:
            state["closed"] = True

    async def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless(), headers={"content-type": "text/event-stream"})

    async def leave_after_three(result: Call) -> None:
        while len(result.chunks) < 3:
            result.sent_body.clear()
            await result.sent_body.wait()

    body = {**CHAT, "stream": True}
    result = asyncio.run(
        call(
            app_with(upstream),
            "/v1/chat/completions",
            body,
            gateway_data["secret"],
            disconnect=leave_after_three,
        )
    )
    assert state["closed"], "the upstream stream was closed"
    assert 3 <= state["produced"] < 10
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and sample.completion_tokens == len(result.chunks)
    assert Usage.objects.get().completion_tokens == sample.completion_tokens


Upstream = Callable[[httpx.Request], Awaitable[httpx.Response]]
ERROR = {"error": {"message": "engine blew up", "type": "InternalServerError", "code": 500}}
CHUNK_THEN_ERROR = (
    b"data: " + json.dumps(chunk("a", 5, 1)).encode() + b"\n\ndata: " + json.dumps(ERROR).encode() + b"\n\n"
)


def lingering_engine(head: bytes) -> tuple[Upstream, dict[str, bool]]:
    """An engine that streams ``head``, then keeps its end open until the relay closes it (state
    "closed" then True)."""
    state = {"closed": False}

    async def head_then_linger() -> AsyncIterator[bytes]:
        try:
            yield head
            await asyncio.Event().wait()  # the engine does not close its end
        finally:
            state["closed"] = True

    async def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=head_then_linger(), headers={"content-type": "text/event-stream"})

    return upstream, state


def test_a_client_that_leaves_after_done_was_served_in_full(gateway_data: dict[str, Any]) -> None:
    # The engine has sent its last event but not yet closed the stream when the client, which has
    # everything, hangs up (the openai client does): that request completed, it was not abandoned.
    upstream, state = lingering_engine(sse(chunk("a", 5, 1), chunk("b", 5, 2), final_usage(5, 2)))

    async def leave_after_done(result: Call) -> None:
        while b"[DONE]" not in result.body:
            result.sent_body.clear()
            await result.sent_body.wait()

    body = {**CHAT, "stream": True}
    app, secret = app_with(upstream), gateway_data["secret"]
    result = asyncio.run(call(app, "/v1/chat/completions", body, secret, disconnect=leave_after_done))
    assert result.events()[-1] == "[DONE]"
    assert state["closed"], "the upstream stream was closed"
    sample = RequestSample.objects.get()
    assert sample.outcome == "completed" and sample.completion_tokens == 2
    assert Usage.objects.get().completion_tokens == 2


def test_an_engine_that_keeps_its_stream_open_after_done_does_not_hold_the_client(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once the client's stream ended only when the engine closed its end: up to the read timeout
    # (600 s) for one that did not, while the async OpenAI SDK (and curl) wait for that end.
    monkeypatch.setattr(relay, "AFTER_DONE_S", 0.05)
    upstream, state = lingering_engine(sse(chunk("a", 5, 1), chunk("b", 5, 2), final_usage(5, 2)))
    body = {**CHAT, "stream": True}
    started = time.monotonic()
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    assert time.monotonic() - started < 5, "the client's stream waited for the engine"
    assert result.events()[-1] == "[DONE]" and result.chunks[-1] == b"", "the client's stream ended"
    assert state["closed"], "the engine's stream was closed"
    sample = RequestSample.objects.get()
    assert sample.outcome == "completed" and sample.completion_tokens == 2
    assert Usage.objects.get().completion_tokens == 2


def test_an_engine_that_keeps_its_stream_open_after_its_error_does_not_hold_the_client(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine's error event ends the client's stream as [DONE] does; one that kept its end open
    # after it held the client for the read timeout (600 s).
    monkeypatch.setattr(relay, "AFTER_DONE_S", 0.05)
    upstream, state = lingering_engine(CHUNK_THEN_ERROR)
    body = {**CHAT, "stream": True}
    started = time.monotonic()
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    assert time.monotonic() - started < 5, "the client's stream waited for the engine"
    events = result.events()
    assert len(events) == 2 and "engine blew up" in events[-1], events
    assert result.chunks[-1] == b"", "the client's stream ended"
    assert state["closed"], "the engine's stream was closed"
    sample = RequestSample.objects.get()
    assert sample.outcome == "failed" and sample.completion_tokens == 1


def test_a_client_gone_when_the_server_sends_is_booked_as_a_disconnect(gateway_data: dict[str, Any]) -> None:
    # The ASGI spec has a server's send() to a closed connection raise OSError (daphne and uvicorn
    # drop the message instead). That error left the relay before the booking: the engine's tokens
    # were neither booked nor sampled, and it went on as the ASGI app's crash.
    state = {"closed": False}

    async def endless() -> AsyncIterator[bytes]:
        try:
            for n in range(1, 100):
                yield b"data: " + json.dumps(chunk("x", 5, n)).encode() + b"\n\n"
                await asyncio.sleep(0.01)
        finally:
            state["closed"] = True

    async def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless(), headers={"content-type": "text/event-stream"})

    messages = [{"type": "http.request", "body": json.dumps({**CHAT, "stream": True}).encode()}]
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message.get("body"):
            if len(bodies) == 2:
                raise ConnectionResetError("the client closed its connection")
            bodies.append(message["body"])

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the server does not tell of the departure here
        raise AssertionError("unreachable")

    headers = [(b"authorization", f"Bearer {gateway_data['secret']}".encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    asyncio.run(asyncio.wait_for(app_with(upstream)(scope, receive, send), 10))  # raises nothing
    assert state["closed"], "the upstream stream was closed"
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and (sample.prompt_tokens, sample.completion_tokens) == (5, 3)
    assert Usage.objects.get().completion_tokens == 3


def test_a_client_that_leaves_after_the_engines_error_is_booked_failed(gateway_data: dict[str, Any]) -> None:
    # The engine's error ends the client's stream (869f9bc) and the request failed; a client that
    # hangs up on it (the openai SDK raises, closing the stream) before the engine closes its end
    # did not abandon a request in progress.
    upstream, _ = lingering_engine(CHUNK_THEN_ERROR)

    async def leave_after_error(result: Call) -> None:
        while b"engine blew up" not in result.body:
            result.sent_body.clear()
            await result.sent_body.wait()

    body = {**CHAT, "stream": True}
    app, secret = app_with(upstream), gateway_data["secret"]
    result = asyncio.run(call(app, "/v1/chat/completions", body, secret, disconnect=leave_after_error))
    assert "engine blew up" in result.events()[-1]
    sample = RequestSample.objects.get()
    assert sample.outcome == "failed" and sample.completion_tokens == 1
