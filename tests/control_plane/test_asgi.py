"""The ASGI entry point: HTTP reaches Django; browser websockets are origin-checked."""

from __future__ import annotations

import pytest
from channels.testing import HttpCommunicator, WebsocketCommunicator

from config.asgi import application


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_it_serves_http_through_the_asgi_app() -> None:
    request = HttpCommunicator(application, "GET", "/api/health/", headers=[(b"host", b"127.0.0.1")])
    response = await request.get_response(timeout=30)
    assert response["status"] == 200


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)  # Channels closes stale DB connections on every message
async def test_it_refuses_browser_sockets_opened_from_another_site() -> None:
    communicator = WebsocketCommunicator(
        application, "/ws/jobs/", headers=[(b"origin", b"https://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert connected is False
    await communicator.disconnect()


def test_daphne_names_every_status_the_platform_sends() -> None:
    # daphne takes the reason phrase from Twisted's table, which has no 429: quota answers went
    # out as "HTTP/1.1 429 Unknown Status" until config.asgi filled the gaps.
    from twisted.web import http

    for status in (429, 431, 451):
        assert http.RESPONSES[status] != b"Unknown Status"
    assert http.RESPONSES[429] == b"Too Many Requests"
    assert http.RESPONSES[200] == b"OK"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize(
    "path", ["/ws/agent/nope/", "/ws/agent", "/ws/nope/", "/ws/dashboard/jobs/abc/", "/ws/dashboard/"]
)
async def test_it_refuses_sockets_on_paths_no_route_serves(path: str) -> None:
    # Before: URLRouter raised ValueError, which daphne answers with HTTP 500 and a traceback.
    communicator = WebsocketCommunicator(
        application, path, headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    )
    connected, _ = await communicator.connect(timeout=10)
    assert connected is False
    await communicator.wait(timeout=5)  # the application has ended, without raising
