"""ASGI entry point (daphne): HTTP goes to Django, websockets to the routes in config/routing.py."""

from __future__ import annotations

import os
import sys
from http import HTTPStatus
from pathlib import Path
from typing import Any

# platform/ is a source root, not a package: make `config` importable however we were started.
for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parents[1]):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# No persistent database connections here, whatever DB_CONN_MAX_AGE says (it is the Celery
# processes'): under ASGI Django runs each request's synchronous part in a thread of its own, so a
# connection kept for reuse is never reused, one per concurrent request left open until its age
# runs out (Django's docs: disable them under ASGI, ticket #33497). Measured with 60 s against
# PostgreSQL: 200 concurrent API requests left 62 connections open (of max_connections 100); with 0, 1.
os.environ["DB_CONN_MAX_AGE"] = "0"

from django.core.asgi import get_asgi_application  # noqa: E402

# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from agents import sweeper  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter  # noqa: E402
from gateway.asgi_io import app_path  # noqa: E402
from gateway.proxy import GatewayApp  # noqa: E402

from config.routing import (  # noqa: E402
    AGENT_PATH_PREFIX,
    agent_websocket_urlpatterns,
    browser_websocket_urlpatterns,
    routed,
)
from core.websocket_origin import BrowserOriginValidator  # noqa: E402
from core.websocket_unavailable import WebsocketUnavailableMiddleware  # noqa: E402


def _name_every_status() -> None:
    """daphne writes its status lines from Twisted's phrase table, which lacks some statuses we
    send (429: the gateway's quotas; Twisted 26.10), so those went out as "429 Unknown Status".
    Fill the gaps from the standard library's names; a Twisted without daphne is left as it is."""
    try:
        from twisted.web import http
    except ImportError:
        return
    for status in HTTPStatus:
        http.RESPONSES.setdefault(status.value, status.phrase.encode("ascii"))


_name_every_status()
# A socket the database or Redis cannot serve now is closed cleanly, not with a 500 and a traceback:
# browsers' handshakes refused (live.js retries), agents' closed with 4503 (core/websocket_unavailable.py).
_agent_app = WebsocketUnavailableMiddleware(routed(agent_websocket_urlpatterns), refuse_handshake=False)
# The OpenAI-compatible chat gateway is a plain ASGI app (see gateway/proxy.py for why).
_gateway_app = GatewayApp()
_browser_app = WebsocketUnavailableMiddleware(
    BrowserOriginValidator(AuthMiddlewareStack(routed(browser_websocket_urlpatterns))),
    refuse_handshake=True,
)


async def websocket_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Send agent paths to the token-authenticated routes, everything else to the browser stack."""
    sweeper.ensure_started()
    if app_path(scope).startswith(AGENT_PATH_PREFIX):
        await _agent_app(scope, receive, send)
    else:
        await _browser_app(scope, receive, send)


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Send /v1 (the chat gateway) to the gateway app, everything else to Django.

    Whatever this process serves first also starts its liveness sweep (agents/sweeper.py), not
    only an agent's connection: a web process that no agent reaches (restarted while an agent was
    down, or a second one behind a balancer) must still mark silent hosts offline without beat."""
    sweeper.ensure_started()
    path = app_path(scope)  # below the deployment's URL prefix (root_path), as Django routes
    if path == "/v1" or path.startswith("/v1/"):
        await _gateway_app(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter({"http": http_app, "websocket": websocket_app})
