"""`BrowserOriginValidator`: the Origin check of the dashboard's websockets (config/asgi.py).

A browser sends the user's session cookie with any websocket a page opens, whatever site the page
is from, and a websocket has no CORS: only its Origin header tells the server which site opened it
(cross-site websocket hijacking). So a browser socket goes on only when, as Django's CSRF check
requires of an unsafe request,

- its ``Host`` is one of ALLOWED_HOSTS (as Django validates it: ``'*'`` any, ``.example.com`` and its
  subdomains), as any request this site serves;
- and its Origin is either the request's own host: the Origin's host and port are the ``Host``
  header's (a Host without a port takes the Origin scheme's default one). The scheme is not
  compared: behind a TLS proxy the page is https:// while the socket reaches daphne as plain ws://;
- or one of CSRF_TRUSTED_ORIGINS, matched as Django's CSRF check matches it (exactly, or
  ``https://*.example.com`` for its subdomains).

Channels' ``AllowedHostsOriginValidator``, used before, matched only the Origin's host name against
ALLOWED_HOSTS: any port or scheme of a listed name, and every listed name for every other, passed
(a page of another app on ``http://localhost:3000`` opened the sockets of ``localhost:8000`` with
the session cookie, which browsers send whatever the port), and ``'*'`` passed every Origin, even
none. Settings are read on each handshake. A refused socket's handshake is refused (daphne answers
403). Agents' sockets (/ws/agent/) are not browsers, send no Origin and are not checked.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import SplitResult, urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def header(scope: Scope, name: bytes) -> str | None:
    """The value of the request's header ``name`` (lower case), or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin1")
    return None


def _parsed_origin(origin: str) -> SplitResult | None:
    """``origin`` split, if it is scheme://host[:port] and nothing else ("null" is not)."""
    try:
        parts = urlsplit(origin.strip().lower())
        parts.port  # noqa: B018  (raises on a port that is not a number in 0..65535)
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return parts


def same_host(origin: SplitResult, host: str | None) -> bool:
    """Whether ``origin`` names the host and port of the ``Host`` header ``host``, any scheme."""
    if not host:
        return False
    try:
        request = urlsplit("//" + host.strip().lower())
        request_port = request.port
    except ValueError:
        return False
    if not request.hostname or request.netloc != host.strip().lower():  # no path, user, query
        return False
    default = DEFAULT_PORTS[origin.scheme]
    return origin.hostname == request.hostname and (origin.port or default) == (request_port or default)


def trusted(origin: SplitResult) -> bool:
    """Whether ``origin`` is one of CSRF_TRUSTED_ORIGINS (as Django's CSRF check matches them)."""
    text = f"{origin.scheme}://{origin.netloc}"
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        entry = entry.lower().rstrip("/")
        if "*" not in entry:
            if text == entry:
                return True
            continue
        pattern = urlsplit(entry)
        if pattern.scheme == origin.scheme and is_same_domain(origin.netloc, pattern.netloc.lstrip("*")):
            return True
    return False


def host_allowed(host: str | None) -> bool:
    """Whether the ``Host`` header ``host`` names one of ALLOWED_HOSTS, as Django's
    ``HttpRequest.get_host()`` validates it (with DEBUG and none listed: localhost)."""
    domain, _ = split_domain_port(host or "")
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def origin_allowed(scope: Scope) -> bool:
    """Whether a browser socket with this scope may go on (see the module docstring)."""
    origin = header(scope, b"origin")
    parts = None if origin is None else _parsed_origin(origin)
    host = header(scope, b"host")
    if parts is None or not host_allowed(host):
        return False
    return same_host(parts, host) or trusted(parts)


class BrowserOriginValidator:
    """Runs ``application`` for a browser socket whose Origin passes (see the module docstring)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if origin_allowed(scope):
            await self.application(scope, receive, send)
            return
        logger.info(
            "Refused a websocket on %s: its Origin %r is not its host (%r, which must be one of"
            " ALLOWED_HOSTS) nor in CSRF_TRUSTED_ORIGINS.",
            scope.get("path"),
            header(scope, b"origin"),
            header(scope, b"host"),
        )
        await WebsocketDenier()(scope, receive, send)
