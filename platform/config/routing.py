"""Websocket URL patterns: the one place apps register their consumers.

Two lists, because the two kinds of client authenticate differently:

- ``browser_websocket_urlpatterns``: dashboard sockets. They run behind the session middleware and
  an Origin check (a page on another site must not open them with the user's cookies): the
  request's own Host (host and port, one of ALLOWED_HOSTS) or one of CSRF_TRUSTED_ORIGINS
  (core/websocket_origin.py).
- ``agent_websocket_urlpatterns``: GPU agents, every path under ``AGENT_PATH_PREFIX``
  (``/ws/agent/``). Agents are not browsers and send no Origin; their consumer authenticates the
  per-host agent token itself.

Apps add ``path(...)`` entries to these lists here (import the consumer at the top, add the route);
config/asgi.py dispatches on the path prefix and routes each list through `routed()`, which refuses
a path no entry serves.
"""

from __future__ import annotations

import logging

# Import only after Django's set-up (config/asgi.py does that before importing this module).
from agents.consumers import AgentConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from dashboard.routing import websocket_urlpatterns as dashboard_websocket_urlpatterns
from django.urls import URLPattern, URLResolver, path, re_path

log = logging.getLogger(__name__)

AGENT_PATH_PREFIX = "/ws/agent/"

browser_websocket_urlpatterns: list[URLPattern | URLResolver] = [
    # dashboard: live host map, jobs, model metrics, engine log tails (dashboard/consumers.py).
    *dashboard_websocket_urlpatterns,
]

agent_websocket_urlpatterns: list[URLPattern | URLResolver] = [
    # agents: the GPU agents' link (agents/consumers.py).
    path("ws/agent/", AgentConsumer.as_asgi()),
]


class NoRouteConsumer(AsyncWebsocketConsumer):
    """A socket on a path no route serves: refused before it is accepted (daphne answers the
    handshake with HTTP 403, as for a socket without credentials). Without it, channels' URLRouter
    raises ValueError: daphne answered any client that asked with HTTP 500 and logged an
    "Exception inside application" traceback each time."""

    async def connect(self) -> None:
        log.info("Refused a websocket on %s: no route serves it.", self.scope.get("path"))
        await self.close()


def routed(patterns: list[URLPattern | URLResolver]) -> URLRouter:
    """A router for ``patterns`` that refuses every other path (`NoRouteConsumer`)."""
    return URLRouter([*patterns, re_path(r"", NoRouteConsumer.as_asgi())])
