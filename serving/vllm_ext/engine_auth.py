"""An ASGI middleware for vLLM's OpenAI server: every path but health and metrics needs the key.

vLLM's own key check (``VLLM_API_KEY`` / ``--api-key``) guards only paths under ``/v1``, ``/v2``,
``/inference`` and ``/cohere``. vLLM 0.32 also always serves ``POST /invocations`` (SageMaker's
entry point, which runs chat and completion bodies) and ``/generative_scoring``, unguarded: anyone
who reached an engine's port could generate past the gateway's API keys and quotas. The agent
starts engines that have a key with ``--middleware serving.vllm_ext.engine_auth.EngineKeyGuard``
(gpu_agent/engines/command.py), which refuses any request without ``Authorization: Bearer <key>``
except on ``OPEN_PATHS``: the agent's health check and metrics scrape, which carry no key and serve
no model output.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})


class EngineKeyGuard:
    """Refuse (401) every HTTP request and websocket outside ``OPEN_PATHS`` that does not carry
    the key in ``$VLLM_API_KEY`` as a bearer token; with no key set, let everything through."""

    def __init__(self, app: App) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._digest is None or scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = b'{"error":"Unauthorized"}'
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: Scope) -> bool:
        path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
        if path.rstrip("/") in OPEN_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    given = hashlib.sha256(token.encode()).digest()
                    return hmac.compare_digest(given, self._digest or b"")
        return False
