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
