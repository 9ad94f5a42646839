"""The ASGI side of the /v1 gateway (gateway/proxy.py): reading the request body, watching for the
client's disconnect, and wrappers of ``send`` that note or change what goes out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.validation import MAX_BODY_BYTES, body_too_large

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def app_path(scope: Scope) -> str:
    """The request's path below the deployment's URL prefix (ASGI's ``root_path``, WSGI's
    SCRIPT_NAME), as Django's ``path_info`` and Channels' URLRouter read it: ``path`` includes the
    prefix, so ``/llm/v1/chat/completions`` under ``root_path`` ``/llm`` is ``/v1/chat/completions``."""
    path: str = scope["path"]
    root: str = scope.get("root_path") or ""
    return path.removeprefix(root) if root else path


class ClientGone(Exception):
    """The client disconnected: while the request body was being read, or (the server's send()
    raised OSError) while it was being answered."""


async def read_body(receive: Receive) -> bytes:
    """The request body, refused (413) as soon as it passes MAX_BODY_BYTES: a client cannot make
    this process hold more than the limit by sending a larger body."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise body_too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = headers or [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def noting_start(send: Send, started: list[bool]) -> Send:
    """``send`` that appends to ``started`` once the answer's headers are sent."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.append(True)
        await send(message)

    return sending


def raising_gone(send: Send) -> Send:
    """``send`` that raises ClientGone where the server's raises OSError: the ASGI spec's word for
    a send() to a client that closed its connection (daphne and uvicorn drop it instead, and tell
    of the departure through receive())."""

    async def sending(message: dict[str, Any]) -> None:
        try:
            await send(message)
        except OSError as exc:
            raise ClientGone from exc

    return sending


def noting_end(send: Send, answered: list[bool]) -> Send:
    """``send`` that appends to ``answered`` as the answer's last body message is sent (before:
    daphne queues http.disconnect while it sends it)."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.append(True)
        await send(message)

    return sending


def with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """``send`` that adds ``extra`` to the response's headers."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


def without_body(send: Send) -> Send:
    """``send`` for a HEAD request: the answer's status and headers as a GET would have them, its
    body bytes dropped (RFC 9110 9.3.2: a HEAD answer has no content)."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            message = {**message, "body": b""}
        await send(message)

    return sending
