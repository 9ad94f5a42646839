"""A small real websocket server standing in for the control plane's /ws/agent/ in link tests."""

from __future__ import annotations

import asyncio
import http
import json
import time
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response


class ControlPlaneStub:
    """Records every frame agents send (decoded JSON, receive time); can push frames to them.

    `close_code`: if set, the server closes each connection with it right after the first frame
    (how a control plane refuses a token after accepting the socket).
    """

    def __init__(self, token: str = "good-token", close_code: int | None = None) -> None:
        self.token = token
        self.close_code = close_code
        self.frames: list[tuple[float, dict[str, Any]]] = []
        self.handshakes = 0
        self.authorizations: list[list[str]] = []  # each handshake's Authorization header values
        self.connections: list[ServerConnection] = []
        self.port = 0
        self._server: Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for _, f in self.frames if f.get("type") == kind]

    def times_of(self, kind: str) -> list[float]:
        return [t for t, f in self.frames if f.get("type") == kind]

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        self.handshakes += 1
        self.authorizations.append(request.headers.get_all("Authorization"))
        if request.path != "/ws/agent/":
            return connection.respond(http.HTTPStatus.NOT_FOUND, "no such path\n")
        if f"Bearer {self.token}" not in self.authorizations[-1]:  # as the control plane reads it
            return connection.respond(http.HTTPStatus.FORBIDDEN, "bad token\n")
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        async for message in ws:
            self.frames.append((time.monotonic(), json.loads(message)))
            if self.close_code is not None:
                await ws.close(self.close_code, "token refused")

    async def start(self) -> None:
        self._server = await serve(self._handler, "127.0.0.1", self.port, process_request=self._check)
        self.port = next(iter(self._server.sockets)).getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        self._server = None

    async def push(self, text: str) -> None:
        """Send raw text to the latest connection."""
        await self.connections[-1].send(text)


async def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll `predicate()` until true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)
