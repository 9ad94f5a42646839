"""Websocket URL patterns: the one place apps register their consumers.

Two lists, because the two kinds of client authenticate differently:

- ``browser_websocket_urlpatterns``: dashboard sockets. They run behind the session middleware and
  an Origin check against ALLOWED_HOSTS (a page on another site must not open them with the
  user's cookies).
- ``agent_websocket_urlpatterns``: GPU agents, every path under ``AGENT_PATH_PREFIX``
  (``/ws/agent/``). Agents are not browsers and send no Origin; their consumer authenticates the
  per-host agent token itself.

Apps add ``path(...)`` entries to these lists here (import the consumer, append the route);
config/asgi.py dispatches on the path prefix.
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

AGENT_PATH_PREFIX = "/ws/agent/"

browser_websocket_urlpatterns: list[URLPattern | URLResolver] = []
agent_websocket_urlpatterns: list[URLPattern | URLResolver] = []

# agents: the GPU agents' link (agents/consumers.py). Imported here, after Django's set-up in asgi.py.
from django.urls import path  # noqa: E402

from agents.consumers import AgentConsumer  # noqa: E402

agent_websocket_urlpatterns.append(path("ws/agent/", AgentConsumer.as_asgi()))
