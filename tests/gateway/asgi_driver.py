"""Driving the /v1 ASGI app as daphne would, against a STAND-IN upstream (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
from gateway.proxy import GatewayApp

Handler = Callable[[httpx.Request], Any]


class Call:
    """One request through the app, with what it sent back."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.chunks: list[bytes] = []
        self.sent_body = asyncio.Event()
        self.ended = asyncio.Event()  # the answer's last body message was sent

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        return [e.removeprefix("data: ") for e in self.body.decode().split("\n\n") if e]


async def call(
    app: GatewayApp,
    path: str,
    body: Any = None,
    secret: str | None = None,
    method: str = "POST",
    disconnect: Callable[[Call], Any] | None = None,
) -> Call:
    """Drive ``app`` as daphne would; ``disconnect(call)`` is awaited before http.disconnect.

    ``body`` is sent as JSON, or as it is if it is bytes.
    """
    result = Call()
    headers = [(b"content-type", b"application/json")]
    if secret is not None:
        headers.append((b"authorization", f"Bearer {secret}".encode()))
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    messages = [{"type": "http.request", "body": raw}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        if disconnect is not None:
            await disconnect(result)
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            result.status = message["status"]
            result.headers = dict(message.get("headers", []))
        else:
            result.chunks.append(message.get("body", b""))
            result.sent_body.set()
            if not message.get("more_body", False):
                result.ended.set()

    await asyncio.wait_for(app(scope, receive, send), 10)
    return result


class StandInEngine(httpx.MockTransport):
    """``handler`` answers as the engine would; first the request's ``trace`` hears what httpcore
    tells it once the request is sent (the engine has it: the wait for its headers starts)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        trace = request.extensions.get("trace")
        if trace is not None:
            await trace("http11.receive_response_headers.started", {"request": request})
        return await super().handle_async_request(request)


def app_with(handler: Handler) -> GatewayApp:
    return GatewayApp(client_factory=lambda: httpx.AsyncClient(transport=StandInEngine(handler)))


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chunk(text: str, prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "tiny",
        "choices": [{"index": 0, "delta": {"content": text}}],
        "usage": usage,
    }


def final_usage(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "tiny", "choices": [], "usage": usage}


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def never(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"no upstream request expected, got {request.url}")
