"""Browser websockets need an Origin of this site: the request's own host and port, or one of
CSRF_TRUSTED_ORIGINS, and a Host that ALLOWED_HOSTS lists (as Django's CSRF check of an unsafe
request).

With '*' in ALLOWED_HOSTS, channels' AllowedHostsOriginValidator accepted any Origin (and none), so
a page on another site could open the dashboard's sockets with its visitor's session cookie
(cross-site websocket hijacking). With host names listed it compared only the Origin's host name
with the list: a page on any port of a listed name (another app on http://localhost:3000), or on
any other listed name or subdomain of a listed '.example.com', opened them too. Driven through
config.asgi's application.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from accounts.models import User
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings
from inventory.services import issue_agent_token, register_host

import config.asgi

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("close_worker_thread_connections"),
]

HOST = b"platform.example:8000"


@pytest.fixture
def any_host_app() -> Iterator[Any]:
    """config.asgi's application as built at start-up with ALLOWED_HOSTS='*' (rebuilt afterwards
    with the tests' own settings)."""
    with override_settings(ALLOWED_HOSTS=["*"]):
        yield importlib.reload(config.asgi).application
    importlib.reload(config.asgi)


@pytest.fixture
def session_id(viewer_user: User) -> str:
    """The session cookie of a browser signed in as a viewer."""
    client = Client()
    client.force_login(viewer_user)
    return client.cookies["sessionid"].value


async def opens(app: Any, session_id: str, *headers: tuple[bytes, bytes]) -> bool:
    """Whether a jobs socket with ``headers`` and the session cookie opens (and sends its snapshot)."""
    cookie = (b"cookie", f"sessionid={session_id}".encode())
    comm = WebsocketCommunicator(app, "/ws/dashboard/jobs/", headers=[cookie, *headers])
    connected, _ = await comm.connect(timeout=10)
    if connected:
        assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
        await comm.disconnect()
    return connected


@pytest.mark.parametrize(
    "headers",
    [
        [(b"origin", b"https://evil.example"), (b"host", HOST)],  # another site
        [(b"origin", b"http://platform.example.evil.example:8000"), (b"host", HOST)],
        [(b"origin", b"http://platform.example:9000"), (b"host", HOST)],  # another port
        [(b"origin", b"https://platform.example"), (b"host", HOST)],  # 443, not 8000
        [(b"origin", b"null"), (b"host", HOST)],  # a sandboxed frame, a file:// page
        [(b"host", HOST)],  # no Origin: browsers always send one
        [(b"origin", b"http://platform.example:8000")],  # no Host to compare with
    ],
)
async def test_it_refuses_sockets_from_another_origin_where_any_host_is_allowed(
    any_host_app: Any, session_id: str, headers: list[tuple[bytes, bytes]]
) -> None:
    assert not await opens(any_host_app, session_id, *headers)


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        (b"http://platform.example:8000", HOST),
        (b"https://PLATFORM.example:8000", HOST),  # any scheme (a TLS proxy in front), any case
        (b"https://platform.example", b"platform.example"),  # the default port of the Origin's scheme
        (b"https://platform.example", b"platform.example:443"),
        (b"http://[::1]:8000", b"[::1]:8000"),
    ],
)
async def test_it_opens_sockets_from_the_requests_own_host(
    any_host_app: Any, session_id: str, origin: bytes, host: bytes
) -> None:
    assert await opens(any_host_app, session_id, (b"origin", origin), (b"host", host))


@override_settings(CSRF_TRUSTED_ORIGINS=["https://ui.example.com", "https://*.corp.example"])
@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (b"https://ui.example.com", True),
        (b"https://a.corp.example", True),
        (b"https://corp.example", True),  # as Django's CSRF check matches *.corp.example
        (b"http://ui.example.com", False),  # the scheme of a trusted origin counts
        (b"https://ui.example.com:8443", False),
        (b"https://evil.example", False),
    ],
)
async def test_it_opens_sockets_from_csrf_trusted_origins(
    any_host_app: Any, session_id: str, origin: bytes, allowed: bool
) -> None:
    assert await opens(any_host_app, session_id, (b"origin", origin), (b"host", HOST)) is allowed


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [  # the tests' ALLOWED_HOSTS: 127.0.0.1, localhost, [::1]
        (b"http://127.0.0.1", b"127.0.0.1", True),
        (b"http://localhost:8000", b"localhost:8000", True),
        (b"https://[::1]:8000", b"[::1]:8000", True),
        (b"http://localhost:3000", b"localhost:8000", False),  # another app on another port
        (b"http://localhost:8000", b"127.0.0.1:8000", False),  # another listed host
        (b"https://127.0.0.1", b"127.0.0.1:8000", False),  # 443, not 8000
        (b"https://evil.example", b"127.0.0.1", False),
        (b"http://evil.example:8000", b"evil.example:8000", False),  # a Host not listed (DNS rebinding)
    ],
)
async def test_it_needs_the_requests_own_host_where_host_names_are_listed(
    session_id: str, origin: bytes, host: bytes, allowed: bool
) -> None:
    app = config.asgi.application
    assert await opens(app, session_id, (b"origin", origin), (b"host", host)) is allowed


async def test_it_refuses_another_subdomain_of_a_listed_domain(session_id: str) -> None:
    app = config.asgi.application
    with override_settings(ALLOWED_HOSTS=[".example.com"]):
        own = (b"host", b"platform.example.com")
        assert await opens(app, session_id, (b"origin", b"https://platform.example.com"), own)
        assert not await opens(app, session_id, (b"origin", b"https://files.example.com"), own)
        assert not await opens(app, session_id, (b"origin", b"https://example.com"), own)


@override_settings(CSRF_TRUSTED_ORIGINS=["https://ui.example.com"])
async def test_csrf_trusted_origins_open_sockets_to_listed_hosts_only(session_id: str) -> None:
    app = config.asgi.application
    trusted = (b"origin", b"https://ui.example.com")
    assert await opens(app, session_id, trusted, (b"host", b"localhost:8000"))
    assert not await opens(app, session_id, trusted, (b"host", b"evil.example:8000"))
    assert not await opens(app, session_id, trusted)  # no Host: browsers always send one
    assert not await opens(app, session_id, (b"host", b"127.0.0.1"))  # no Origin


async def test_agent_sockets_have_no_origin_check(any_host_app: Any) -> None:
    host = await database_sync_to_async(register_host)("gpu-a", "10.0.0.5")
    token = await database_sync_to_async(lambda: issue_agent_token(host).plaintext)()
    for headers in ([], [(b"origin", b"https://evil.example")]):
        comm = WebsocketCommunicator(
            any_host_app, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode()), *headers]
        )
        assert (await comm.connect(timeout=10))[0]
        await comm.disconnect()
