"""What the /v1 app books and records against a STAND-IN upstream (httpx.MockTransport, and a
real socket server where the connection itself matters): every choice's tokens of a stream left
early, a client that leaves before a non-streamed answer or while the connection is being made,
and vLLM's continuous usage passed through."""

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
from gateway.models import RequestSample, Usage
from gateway.proxy import GatewayApp

from tests.gateway.asgi_driver import CHAT, Call, app_with, call, chunk, final_usage, never, sse

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

    async def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=then_linger(), headers={"content-type": "text/event-stream"})

    async def leave_after_all(result: Call) -> None:
        while result.body.count(b"\n\n") < len(chunks):
            result.sent_body.clear()
            await result.sent_body.wait()

    base = CHAT if path == "/v1/chat/completions" else {"model": "tiny", "max_tokens": 3}
    body = {**base, **extra, "stream": True}
    asyncio.run(call(app_with(upstream), path, body, gateway_data["secret"], disconnect=leave_after_all))
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected"
    assert (sample.prompt_tokens, sample.completion_tokens) == booked
    usage = Usage.objects.get()
    assert (usage.prompt_tokens, usage.completion_tokens) == booked


def test_a_client_that_leaves_before_a_non_streamed_answer_is_recorded_as_disconnected(
    gateway_data: dict[str, Any],
) -> None:
    # vLLM sends a non-streamed answer's headers with its body, at the end: the client leaves
    # while the engine, which took the request, is still generating.
    taken = asyncio.Event()
    state = {"cancelled": False}

    async def upstream(request: httpx.Request) -> httpx.Response:
        taken.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        raise AssertionError("unreachable")

    async def leave_while_generating(result: Call) -> None:
        await taken.wait()

    result = asyncio.run(
        call(
            app_with(upstream),
            "/v1/chat/completions",
            CHAT,
            gateway_data["secret"],
            disconnect=leave_while_generating,
        )
    )
    assert result.status is None and state["cancelled"], "the engine's request was given up"
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and not sample.stream
    assert sample.deployment_id == gateway_data["deployments"][0].pk
    assert Usage.objects.get().requests == 1


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
    # request and is generating, its headers to come with the answer.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    Replica.objects.update(base_url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    app = GatewayApp(client_factory=lambda: httpx.AsyncClient(timeout=httpx.Timeout(30.0)))

    async def scenario() -> None:
        received = asyncio.Event()

        async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            received.set()
            await asyncio.Event().wait()

        server = await asyncio.start_server(engine, sock=listener)

        async def leave_while_generating(result: Call) -> None:
            await received.wait()

        async with server:
            chat = "/v1/chat/completions"
            await call(app, chat, CHAT, gateway_data["secret"], disconnect=leave_while_generating)
            server.close()

    asyncio.run(scenario())
    sample = RequestSample.objects.get()
    assert sample.outcome == "disconnected" and Usage.objects.get().requests == 1
    assert [app.router.outstanding(r.pk) for r in Replica.objects.order_by("pk")] == [0, 0]
