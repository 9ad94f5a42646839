"""Websocket URL patterns: the one place apps register their consumers.

Two lists, because the two kinds of client authenticate differently:

- ``browser_websocket_urlpatterns``: dashboard sockets. They run behind the session middleware and
  an Origin check against ALLOWED_HOSTS (a page on another site must not open them with the
  user's cookies).
- ``agent_websocket_urlpatterns``: GPU agents, every path under ``AGENT_PATH_PREFIX``
  (``/ws/agent/``). Agents are not browsers and send no Origin; their consumer authenticates the
  per-host agent token itself.

Apps add ``path(...)`` entries to these lists here (import the consumer at the top, add the route);
config/asgi.py dispatches on the path prefix.
"""

from __future__ import annotations

# Import only after Django's set-up (config/asgi.py does that before importing this module).
from agents.consumers import AgentConsumer
from dashboard.routing import websocket_urlpatterns as dashboard_websocket_urlpatterns
from django.urls import URLPattern, URLResolver, path

AGENT_PATH_PREFIX = "/ws/agent/"

browser_websocket_urlpatterns: list[URLPattern | URLResolver] = [
    # dashboard: live host map, jobs, model metrics, engine log tails (dashboard/consumers.py).
    *dashboard_websocket_urlpatterns,
]

agent_websocket_urlpatterns: list[URLPattern | URLResolver] = [
    # agents: the GPU agents' link (agents/consumers.py).
    path("ws/agent/", AgentConsumer.as_asgi()),
]
