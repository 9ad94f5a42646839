"""An engine that fails after it started to answer (it died, or went silent past the read timeout):
the client gets an OpenAI-format error, never the server's HTML 500, and the request is recorded
as failed. Also the engine's own error events inside a stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from gateway.models import RequestSample, Usage

from tests.gateway.asgi_driver import CHAT, app_with, call, chunk, final_usage, sse

pytestmark = pytest.mark.usefixtures("gateway_data")

CUT = [
    (httpx.ReadError("connection reset"), 502, "upstream_failed"),
    (
        httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
        502,
        "upstream_failed",
    ),
    (httpx.ReadTimeout("timed out"), 504, "upstream_timeout"),
]


class DyingStream(httpx.AsyncByteStream):
    """An engine's response body that sends ``parts``, then breaks off with ``error``; its close
    raises ``close_error`` if one is given (a connection that is already broken)."""

    def __init__(self, parts: list[bytes], error: Exception, close_error: Exception | None = None) -> None:
        self.parts, self.error, self.close_error = parts, error, close_error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        raise self.error

    async def aclose(self) -> None:
        if self.close_error is not None:
            raise self.close_error


class DyingEngine:
    """An upstream whose every answer is a 200 that breaks off; ``hosts``: the replicas it was asked."""

    def __init__(self, parts: list[bytes], error: Exception, close_error: Exception | None = None) -> None:
        self.parts, self.error, self.close_error = parts, error, close_error
        self.hosts: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        return httpx.Response(200, stream=DyingStream(self.parts, self.error, self.close_error))


@pytest.mark.parametrize(("error", "status", "code"), CUT)
def test_a_non_streamed_answer_that_breaks_off_is_a_502_or_504_recorded_as_failed(
    gateway_data: dict[str, Any], error: Exception, status: int, code: str
) -> None:
    upstream = DyingEngine([b'{"id": "c1", "choi'], error)
    app, secret = app_with(upstream), gateway_data["secret"]
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, secret))
    assert result.status == status and result.headers[b"content-type"] == b"application/json"
    assert result.json()["error"]["type"] == "server_error" and result.json()["error"]["code"] == code
    sample = RequestSample.objects.get()
    assert sample.outcome == "failed" and sample.deployment_id == gateway_data["deployments"][0].pk
    assert Usage.objects.get().requests == 1
    asyncio.run(call(app, "/v1/chat/completions", CHAT, secret))
    assert upstream.hosts == ["replica-a", "replica-b"], "the replica that failed is tried last"


def test_a_connection_that_also_fails_to_close_is_still_answered_and_recorded(
    gateway_data: dict[str, Any],
) -> None:
    upstream = DyingEngine([b'{"id"'], httpx.ReadError("reset"), close_error=httpx.ReadError("reset again"))
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 502 and result.json()["error"]["code"] == "upstream_failed"
    assert RequestSample.objects.get().outcome == "failed"


@pytest.mark.parametrize(("error", "status", "code"), CUT)
def test_a_stream_that_breaks_off_ends_with_an_error_event_recorded_as_failed(
    gateway_data: dict[str, Any], error: Exception, status: int, code: str
) -> None:
    sent = sse(chunk("a", 7, 1), chunk("b", 7, 2)).removesuffix(b"data: [DONE]\n\n")
    upstream = DyingEngine([sent, b'data: {"id": "c1", "cho'], error)  # the last event is cut in two
    body = {**CHAT, "stream": True}
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    assert result.status == 200
    *chunks, last = result.events()
    assert [json.loads(c)["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]
    assert json.loads(last) == {
        "error": {
            "message": json.loads(last)["error"]["message"],
            "type": "server_error",
            "param": None,
            "code": code,
        }
    }
    assert "mid-response" in json.loads(last)["error"]["message"]
    sample = RequestSample.objects.get()
    assert sample.outcome == "failed" and sample.completion_tokens == 2
    assert Usage.objects.get().completion_tokens == 2


def test_a_stream_that_breaks_off_after_done_was_served_in_full(gateway_data: dict[str, Any]) -> None:
    upstream = DyingEngine([sse(chunk("a", 7, 1), final_usage(7, 1))], httpx.ReadError("reset"))
    body = {**CHAT, "stream": True}
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    assert result.events()[-1] == "[DONE]" and "error" not in result.body.decode()
    assert RequestSample.objects.get().outcome == "completed"


def test_an_engine_error_event_in_a_stream_gets_the_gateways_shape_and_counts_as_failed(
    gateway_data: dict[str, Any],
) -> None:
    # vLLM's stream generator on a failure: an ErrorResponse event, then [DONE].
    engine_error = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
    stream = sse(chunk("a", 7, 1), engine_error)

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, stream=httpx.ByteStream(stream), headers={"content-type": "text/event-stream"}
        )

    body = {**CHAT, "stream": True}
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    events = result.events()
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": None}
    }
    sample = RequestSample.objects.get()
    assert sample.outcome == "failed" and sample.completion_tokens == 1


def test_an_engine_silent_past_the_read_timeout_before_its_headers_is_a_504_not_a_retry(
    gateway_data: dict[str, Any],
) -> None:
    asked: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)  # it took the request: it may still be generating
        raise httpx.ReadTimeout("timed out", request=request)

    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 504 and result.json()["error"]["code"] == "upstream_timeout"
    assert len(asked) == 1, "another replica would generate the same answer again"
    sample = RequestSample.objects.get()  # the engine took it: recorded, as failed
    assert sample.outcome == "failed" and sample.deployment_id == gateway_data["deployments"][0].pk
    assert Usage.objects.get().requests == 1


class SlowToClose(httpx.AsyncByteStream):
    """An engine's response body whose close suspends (closing a socket does: anyio's ``aclose``
    awaits), as a client's departure or a cancellation can interrupt it."""

    def __init__(self, parts: list[bytes], closing: asyncio.Event, linger: bool = False) -> None:
        self.parts, self.closing, self.linger = parts, closing, linger

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        if self.linger:
            await asyncio.Event().wait()  # still generating

    async def aclose(self) -> None:
        self.closing.set()
        await asyncio.sleep(0.2)


def outstanding(app: Any, gateway_data: dict[str, Any]) -> list[int]:
    """The router's requests in flight on each replica (from outside the event loop)."""
    return [app.router.outstanding(d.replica.pk) for d in gateway_data["deployments"]]


def test_a_replica_that_answered_5xx_is_released_when_the_client_leaves_while_it_closes(
    gateway_data: dict[str, Any],
) -> None:
    closing = asyncio.Event()

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, stream=SlowToClose([b'{"error": "boom"}'], closing))

    async def leave_while_closing(result: Any) -> None:
        await closing.wait()

    app = app_with(upstream)
    chat = "/v1/chat/completions"
    asyncio.run(call(app, chat, CHAT, gateway_data["secret"], disconnect=leave_while_closing))
    assert outstanding(app, gateway_data) == [0, 0], "a request nobody has counts against the replica"


def test_a_relay_cancelled_again_while_it_closes_the_engines_stream_releases_the_replica(
    gateway_data: dict[str, Any],
) -> None:
    # The client leaves mid-stream; the server then cancels the application (daphne does after
    # its application_close_timeout) while the relay still closes the engine's connection.
    closing = asyncio.Event()
    body = sse(chunk("a", 7, 1)).removesuffix(b"data: [DONE]\n\n")

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=SlowToClose([body], closing, linger=True))

    app = app_with(upstream)

    async def scenario() -> None:
        sent = asyncio.Event()
        left = asyncio.Event()
        raw = json.dumps({**CHAT, "stream": True}).encode()
        messages = [{"type": "http.request", "body": raw}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await sent.wait()
            left.set()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message.get("body"):
                sent.set()

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": [(b"authorization", f"Bearer {gateway_data['secret']}".encode())],
        }
        task = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(closing.wait(), 10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert left.is_set()

    asyncio.run(scenario())
    assert outstanding(app, gateway_data) == [0, 0]


class ClosingSocket(DyingStream):
    """A broken-off body whose close suspends, as closing a real socket does (anyio's ``aclose``)."""

    async def aclose(self) -> None:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("stream", [True, False])
def test_a_failure_answered_in_full_stays_failed_when_daphne_reports_the_disconnect_at_once(
    gateway_data: dict[str, Any], stream: bool
) -> None:
    # Daphne queues http.disconnect as the answer's last body message goes out. The relay was
    # still closing the engine's broken connection: the request was recorded as "disconnected",
    # the client's doing, and one without usage waited for a prompt count it did not need.
    sent = sse(chunk("a", 7, 1)).removesuffix(b"data: [DONE]\n\n") if stream else b'{"id": "c1"'

    def upstream(request: httpx.Request) -> httpx.Response:
        assert request.url.path != "/tokenize", "a failed request's prompt was counted"
        return httpx.Response(200, stream=ClosingSocket([sent], httpx.ReadError("reset")))

    async def as_daphne(result: Any) -> None:
        await result.ended.wait()

    body = {**CHAT, "stream": stream}
    app, secret = app_with(upstream), gateway_data["secret"]
    result = asyncio.run(call(app, "/v1/chat/completions", body, secret, disconnect=as_daphne))
    error = json.loads(result.events()[-1])["error"] if stream else result.json()["error"]
    assert error["code"] == "upstream_failed"
    sample = RequestSample.objects.get()
    assert sample.outcome == "failed" and sample.completion_tokens == (1 if stream else 0)
    assert Usage.objects.get().requests == 1


@pytest.mark.parametrize("then", [None, httpx.ReadError("connection reset")])
def test_an_engine_error_event_without_done_is_the_clients_only_error(
    gateway_data: dict[str, Any], then: Exception | None
) -> None:
    """Once the client got the engine's error and then the gateway's "ended early" (or "failed
    mid-response") error as well: two error events for one failure. Now the engine's error is
    the stream's last event, as the gateway's own would be for an engine that closed early."""
    engine_error = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
    # What an engine sends after its error is not passed on (a second error neither), its counts are.
    later = {"error": {"message": "again"}}
    sent = sse(chunk("a", 7, 1), engine_error, chunk("b", 7, 2), later).removesuffix(b"data: [DONE]\n\n")

    def upstream(request: httpx.Request) -> httpx.Response:
        if then is None:
            return httpx.Response(200, stream=httpx.ByteStream(sent))
        return httpx.Response(200, stream=DyingStream([sent], then))

    body = {**CHAT, "stream": True}
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    first, last = (json.loads(e) for e in result.events())
    assert first["choices"][0]["delta"]["content"] == "a"
    assert last == {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
    assert result.ended.is_set()
    sample = RequestSample.objects.get()
    assert (sample.outcome, sample.prompt_tokens, sample.completion_tokens) == ("failed", 7, 2)
    assert (Usage.objects.get().prompt_tokens, Usage.objects.get().completion_tokens) == (7, 2)
