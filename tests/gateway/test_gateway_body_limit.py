"""A /v1 body over MAX_BODY_BYTES is refused (413) as soon as the bytes read pass the limit: the
gateway does not read, or hold, the rest of a larger body first."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.models import Usage
from gateway.validation import MAX_BODY_BYTES

from tests.gateway.asgi_driver import app_with, never

CHUNK = 1 << 20


def test_an_oversized_streamed_body_is_refused_before_it_is_all_read(gateway_data: dict[str, Any]) -> None:
    total_chunks = 64  # 64 MiB offered, 16 times the limit
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": read < total_chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", f"Bearer {gateway_data['secret']}".encode())],
    }
    asyncio.run(asyncio.wait_for(app_with(never)(scope, receive, send), 10))
    assert sent[0]["status"] == 413
    assert b"body_too_large" in b"".join(m.get("body", b"") for m in sent[1:])
    assert read == MAX_BODY_BYTES // CHUNK + 1  # the first chunk past the limit, no further
    assert not Usage.objects.exists()
