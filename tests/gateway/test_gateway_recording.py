"""What the /v1 app books and records against a STAND-IN upstream (httpx.MockTransport, and a
real socket server where the connection itself matters): every choice's tokens of a stream left
early, a client that leaves before a non-streamed answer or a stream's first chunk (booked with
the prompt tokens the engine's /tokenize counts) or while the connection is being made, and
vLLM's continuous usage passed through."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from agents.models import Replica
from gateway import prompt_count
from gateway.models import RequestSample, Usage
from gateway.proxy import GatewayApp

from tests.gateway.asgi_driver import CHAT, Call, Handler, app_with, call, chunk, final_usage, never, sse

pytestmark = pytest.mark.usefixtures("gateway_data")


def choice_chunk(index: int, prompt: int, completion: int, kind: str = "chat") -> dict[str, Any]:
    """A streamed chunk of choice ``index`` with vLLM's continuous usage: that choice's own counts."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if kind == "chat":
        choice: dict[str, Any] = {"index": index, "delta": {"content": "x"}}
        return {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": "tiny",
            "choices": [choice],
            "usage": usage,
        }
    return {
        "id": "c1",
        "object": "text_completion",
        "model": "tiny",
        "choices": [{"index": index, "text": "x"}],
        "usage": usage,
    }


@pytest.mark.parametrize(
    ("path", "extra", "chunks", "booked"),
    [
        # n=3: vLLM's continuous usage counts each choice on its own (3, 2 and 1 tokens so far).
        (
            "/v1/chat/completions",
            {"n": 3},
            [
                choice_chunk(index, 7, completion)
                for index, completion in [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (0, 3)]
            ],
            (7, 6),
        ),
        # Two prompts (5 and 9 tokens), n=2: choice i is prompt i // 2's.
        (
            "/v1/completions",
            {"prompt": ["a", "b"], "n": 2},
            [choice_chunk(i, 5 if i < 2 else 9, 1, "text") for i in range(4)]
            + [choice_chunk(3, 9, 2, "text")],
            (14, 5),
        ),
    ],
)
def test_a_stream_with_several_choices_left_mid_way_books_every_choices_tokens(
    gateway_data: dict[str, Any],
    path: str,
    extra: dict[str, Any],
    chunks: list[dict[str, Any]],
    booked: tuple[int, int],
) -> None:
    async def then_linger() -> AsyncIterator[bytes]:
        yield b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        await asyncio.Event().wait()  # still generating when the client leaves

    asked: list[str] = []

    async def upstream(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, content=then_linger(), headers={"content-type": "text/event-stream"})

    async def leave_after_all(result: Call) -> None:
        while result.body.count(b"\n\n") < len(chunks):
            result.sent_body.clear()
            await result.sent_body.wait()

    base = CHAT if path == "/v1/chat/completions" else {"model": "tiny", "max_tokens": 3}
    body = {**base, **extra, "stream": True}
    asyncio.run(call(app_with(upstream), path, body, gateway_data["secret"], disconnect=leave_after_all))
    assert asked == [path], "the engine's counts are used as they are: no prompt to count again"
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected"
    assert (sample.prompt_tokens, sample.completion_tokens) == booked
    usage = Usage.objects.get()
    assert (usage.prompt_tokens, usage.completion_tokens) == booked


class GeneratingEngine:
    """A stand-in engine that is still generating when the client leaves: vLLM sends a
    non-streamed answer's headers with its body, at the end (``stream``: a stream's headers come
    at once, its first chunk later). Its ``/tokenize`` counts a word a token, plus two a chat
    message for its template; ``count`` answers /tokenize in its place."""

    def __init__(self, stream: bool = False, count: Handler | None = None) -> None:
        self.stream, self.count = stream, count
        self.taken = asyncio.Event()
        self.cancelled = False  # the gateway gave the generation request up
        self.tokenized: list[dict[str, Any]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            body = json.loads(request.content)
            self.tokenized.append(body)
            if self.count is not None:
                return await self.count(request)
            if "messages" in body:
                count = sum(len(m["content"].split()) + 2 for m in body["messages"])
            else:
                count = len(body["prompt"].split())
            return httpx.Response(200, json={"count": count, "max_model_len": 2048, "tokens": [7] * count})
        self.taken.set()
        if self.stream:
            return httpx.Response(200, content=self._chunks(), headers={"content-type": "text/event-stream"})
        await self._generate()
        raise AssertionError("unreachable")

    async def _generate(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def _chunks(self) -> AsyncIterator[bytes]:
        await self._generate()
        yield b""

    async def leave_while_generating(self, result: Call) -> None:
        await self.taken.wait()


NON_STREAMED = [
    # Only the fields that shape the chat template go to /tokenize, with the model's name.
    (
        "/v1/chat/completions",
        {**CHAT, "temperature": 0.5, "chat_template_kwargs": {"enable_thinking": False}},
        [{"model": "tiny", "messages": CHAT["messages"], "chat_template_kwargs": {"enable_thinking": False}}],
        3,
    ),
    ("/v1/completions", {"prompt": "a b c d"}, [{"model": "tiny", "prompt": "a b c d"}], 4),
    # Each prompt once, whatever n is (vLLM's usage counts a prompt once for its n choices).
    (
        "/v1/completions",
        {"prompt": ["one two", "three"], "n": 2, "add_special_tokens": False},
        [
            {"model": "tiny", "prompt": "one two", "add_special_tokens": False},
            {"model": "tiny", "prompt": "three", "add_special_tokens": False},
        ],
        3,
    ),
    ("/v1/completions", {"prompt": [[1, 2, 3], [4, 5]]}, [], 5),  # token ids: counted as they are
    ("/v1/completions", {"prompt": [9, 8, 7]}, [], 3),
]


@pytest.mark.parametrize(("path", "body", "tokenized", "booked"), NON_STREAMED)
def test_a_client_that_leaves_before_a_non_streamed_answer_is_booked_with_its_prompt_tokens(
    gateway_data: dict[str, Any], path: str, body: dict[str, Any], tokenized: list[Any], booked: int
) -> None:
    engine = GeneratingEngine()
    body = {"model": "tiny", "max_tokens": 3, **body}
    secret = gateway_data["secret"]
    result = asyncio.run(call(app_with(engine), path, body, secret, disconnect=engine.leave_while_generating))
    assert result.status is None and engine.cancelled, "the engine's request was given up"
    assert engine.tokenized == tokenized
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and not sample.stream
    assert sample.deployment_id == gateway_data["deployments"][0].pk
    assert (sample.prompt_tokens, sample.completion_tokens) == (booked, 0)
    usage = Usage.objects.get()
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (1, booked, 0)


async def refuses(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, json={"detail": "Not Found"})


async def garbles(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=b"<html>not a count</html>")


async def is_silent(request: httpx.Request) -> httpx.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("count", [refuses, garbles, is_silent])
def test_a_request_whose_engine_cannot_count_its_prompt_is_still_booked_once(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, count: Handler
) -> None:
    monkeypatch.setattr(prompt_count, "TOKENIZE_TIMEOUT_S", 0.2)
    engine = GeneratingEngine(count=count)
    secret = gateway_data["secret"]
    chat = "/v1/chat/completions"
    asyncio.run(call(app_with(engine), chat, CHAT, secret, disconnect=engine.leave_while_generating))
    assert engine.cancelled and len(engine.tokenized) == 1
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and sample.prompt_tokens == 0
    assert Usage.objects.get().requests == 1


def test_a_stream_left_before_its_first_chunk_is_booked_with_its_prompt_tokens(
    gateway_data: dict[str, Any],
) -> None:
    engine = GeneratingEngine(stream=True)
    body = {**CHAT, "stream": True}
    secret = gateway_data["secret"]
    chat = "/v1/chat/completions"
    result = asyncio.run(call(app_with(engine), chat, body, secret, disconnect=engine.leave_while_generating))
    assert result.status == 200 and result.body == b"" and engine.cancelled
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and sample.stream
    assert (sample.prompt_tokens, sample.completion_tokens) == (3, 0)
    assert Usage.objects.get().prompt_tokens == 3


def test_a_client_that_asks_for_continuous_usage_stats_gets_each_chunks_usage(
    gateway_data: dict[str, Any],
) -> None:
    # vLLM's extension: with include_usage and continuous_usage_stats, every chunk has the usage so far.
    def upstream(request: httpx.Request) -> httpx.Response:
        body = sse(chunk("a", 7, 1), chunk("b", 7, 2), final_usage(7, 2))
        return httpx.Response(
            200, stream=httpx.ByteStream(body), headers={"content-type": "text/event-stream"}
        )

    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {**CHAT, "stream": True, "stream_options": options}
    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, gateway_data["secret"]))
    chunks = [json.loads(e) for e in result.events()[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 2]
    assert [c["usage"]["prompt_tokens"] for c in chunks] == [7, 7, 7]
    bad = {**body, "stream_options": {**options, "continuous_usage_stats": "yes"}}
    refused = asyncio.run(call(app_with(never), "/v1/chat/completions", bad, gateway_data["secret"]))
    assert refused.status == 400 and refused.json()["error"]["param"] == "stream_options"


def test_a_client_that_leaves_while_the_gateway_still_connects_to_the_engine_is_not_recorded(
    gateway_data: dict[str, Any],
) -> None:
    # The replica's host does not complete the TCP handshake (its listener's accept queue is full,
    # so the kernel drops the SYNs, as a dead or partitioned host does): no engine ever saw the
    # request, so it is no request of that deployment's and no request of the key's usage.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(4):
        waiting = socket.socket()
        waiting.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            waiting.connect(("127.0.0.1", port))
        queued.append(waiting)
    Replica.objects.update(base_url=f"http://127.0.0.1:{port}")
    app = GatewayApp(client_factory=lambda: httpx.AsyncClient(timeout=httpx.Timeout(30.0)))

    async def leave_while_connecting(result: Call) -> None:
        await asyncio.sleep(0.5)

    try:
        chat = "/v1/chat/completions"
        asyncio.run(call(app, chat, CHAT, gateway_data["secret"], disconnect=leave_while_connecting))
    finally:
        for sock in [*queued, listener]:
            sock.close()
    assert not RequestSample.objects.exists()
    assert not Usage.objects.exists()
    assert [app.router.outstanding(r.pk) for r in Replica.objects.order_by("pk")] == [0, 0]


def test_a_client_that_leaves_once_a_real_engine_has_the_request_is_recorded(
    gateway_data: dict[str, Any],
) -> None:
    # The same over real sockets (httpcore's trace, not the stand-in's): the engine read the whole
    # request and is generating, its headers to come with the answer. The gateway closes that
    # connection (vLLM aborts a request whose connection closes) and asks the engine, on another,
    # to count the prompt.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    Replica.objects.update(base_url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    app = GatewayApp(client_factory=lambda: httpx.AsyncClient(timeout=httpx.Timeout(30.0)))
    seen: dict[str, Any] = {"closed": False, "tokenized": []}

    async def scenario() -> None:
        received = asyncio.Event()

        async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            body = json.loads(await reader.readexactly(length))
            if head.startswith(b"POST /tokenize "):
                seen["tokenized"].append(body)
                answer = json.dumps({"count": 11, "max_model_len": 2048, "tokens": [7] * 11}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )
                await writer.drain()
                writer.close()
                return
            received.set()
            seen["closed"] = await reader.read() == b""  # generating until the gateway hangs up

        server = await asyncio.start_server(engine, sock=listener)

        async def leave_while_generating(result: Call) -> None:
            await received.wait()

        async with server:
            chat = "/v1/chat/completions"
            await call(app, chat, CHAT, gateway_data["secret"], disconnect=leave_while_generating)
            server.close()

    asyncio.run(scenario())
    assert seen["closed"], "the engine's connection was closed"
    assert seen["tokenized"] == [{"model": "tiny", "messages": CHAT["messages"]}]
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and sample.prompt_tokens == 11
    usage = Usage.objects.get()
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (1, 11, 0)
    assert [app.router.outstanding(r.pk) for r in Replica.objects.order_by("pk")] == [0, 0]
