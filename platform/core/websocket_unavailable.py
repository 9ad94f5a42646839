"""`WebsocketUnavailableMiddleware`: a websocket whose application failed because the database or
Redis cannot serve now is closed cleanly, the websocket side of core/middleware.py's 503 page.

Without it the exception left the ASGI app: daphne answered a handshake with HTTP 500 (closed an
accepted socket with 1011) and logged an "Exception inside application" traceback, for every
socket of every open dashboard page and every agent reconnecting, as long as the outage lasted
(sessions, the user and the agent token are all read at the handshake). What counts as "cannot
serve now" is core.unavailable's rule, as for HTTP: any other error still raises.

How the socket is closed depends on who is at the other end (``refuse_handshake``):

- browsers (live.js): the handshake is refused, as for a socket without access (daphne answers
  HTTP 403; the page sees a close 1006 before any open). live.js then loads its page, which
  answers 503 while the outage lasts, and retries with back-off. A socket accepted then closed
  would look "live" for a moment and reset that back-off on every retry.
- agents (gpu_agent/link.py): accepted, then closed with 4503 (``CLOSE_TRY_AGAIN``; daphne closes
  only with 1000 or 3000-4999, not RFC 6455's 1013), which the agent takes as a dropped link. A
  refused handshake would be counted and logged by the agent as a refused token.

A socket already accepted when the failure came is closed with 4503 either way. Each such socket
is logged once, at WARNING, without a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from core.unavailable import backing_service_unavailable
from gpu_agent.protocol import CLOSE_TRY_AGAIN

logger = logging.getLogger(__name__)

Scope = dict[str, Any]


class WebsocketUnavailableMiddleware:
    def __init__(self, inner: Any, *, refuse_handshake: bool) -> None:
        self.inner = inner
        self.refuse_handshake = refuse_handshake

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        accepted = closed = False

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal accepted, closed
            if message["type"] == "websocket.accept":
                accepted = True
            elif message["type"] == "websocket.close":
                closed = True
            await send(message)

        try:
            await self.inner(scope, receive, watched_send)
        except Exception as exc:
            if not backing_service_unavailable(exc):
                raise
            if closed:
                how = "already closed"
            elif accepted or not self.refuse_handshake:
                how = f"closed with {CLOSE_TRY_AGAIN}"
                if not accepted:
                    await send({"type": "websocket.accept"})
                await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN})
            else:
                how = "handshake refused"
                await send({"type": "websocket.close"})
            logger.warning(
                "Websocket %s: a backing service is unavailable (%s: %s); %s.",
                scope.get("path"),
                type(exc).__name__,
                exc,
                how,
            )
