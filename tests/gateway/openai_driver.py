"""The official ``openai`` client driving the /v1 ASGI app in this process, against a stand-in engine.

openai 3.x sends through ``httpx2``, whose ASGITransport calls the app as a server would (it
buffers a streamed answer until the app ends: enough for what a client makes of the bytes).
What a test checks is what a user of the SDK sees: its exception classes and their ``code``,
``type`` and ``param``, its retries (``max_retries``) and its parsed chunks.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import httpx2
import openai

from tests.gateway.asgi_driver import sse

BASE_URL = "http://gateway.test/v1"


class Counted:
    """An ASGI app that counts the requests that reach ``app`` (the SDK's retries included)."""

    def __init__(self, app: Any) -> None:
        self.app, self.requests = app, 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.requests += 1
        await self.app(scope, receive, send)


def openai_client(app: Any, secret: str, max_retries: int = 0) -> openai.AsyncOpenAI:
    """An SDK client of ``app`` (an ASGI app: the GatewayApp, or one wrapping it) with key ``secret``."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    return openai.AsyncOpenAI(base_url=BASE_URL, api_key=secret, http_client=http, max_retries=max_retries)


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def engine(request: httpx.Request) -> httpx.Response:
    """A stand-in vLLM that answers every chat or completion (``n`` choices per prompt), streamed
    (with usage on every chunk, as the gateway asks) or whole."""
    body = json.loads(request.content)
    chat = request.url.path.endswith("/chat/completions")
    prompts = [body.get("prompt")] if chat or isinstance(body.get("prompt"), str) else body["prompt"]
    indexes = range(len(prompts) * (body.get("n") or 1))
    kind = "chat.completion" if chat else "text_completion"
    head = {"id": "cmpl-1", "created": 1, "model": body["model"]}
    if not body.get("stream"):
        choices = [
            {"index": i, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            if chat
            else {"index": i, "text": "hi", "finish_reason": "stop", "logprobs": None}
            for i in indexes
        ]
        return httpx.Response(
            200, json={**head, "object": kind, "choices": choices, "usage": usage(3, len(indexes))}
        )
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"
    chunks = [
        {
            **head,
            "object": chunk_kind,
            "choices": [{"index": i, "delta": {"content": "hi"}} if chat else {"index": i, "text": "hi"}],
            "usage": usage(3, 1),
        }
        for i in indexes
    ]
    final = {**head, "object": chunk_kind, "choices": [], "usage": usage(3 * len(prompts), len(indexes))}
    return httpx.Response(200, stream=httpx.ByteStream(sse(*chunks, final)))
