"""Dashboard sockets stop once their user loses access: deactivated, signed out, password changed.

Driven through the real ASGI stack (session cookie, AuthMiddlewareStack), with the re-check period
shortened to 0.1 s; a socket re-checks before each 1 Hz push, so the next push after a revocation is
replaced by a close with 4401.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from accounts.models import Role, User
from agents.services import agent_group
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from dashboard.consumers import CLOSE_ACCESS_REVOKED
from deployments.models import Deployment
from django.contrib.sessions.models import Session
from django.test import Client, override_settings
from inventory.models import Device, Host

from config.asgi import application
from tests.dashboard.helpers import GIB, add_device_sample

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("close_worker_thread_connections"),
]

QUICK_RECHECK = override_settings(DASHBOARD_AUTH_RECHECK_S=0.1)


@database_sync_to_async
def signed_in(username: str = "carol") -> tuple[User, str]:
    """A viewer and the session cookie of a browser signed in as them."""
    user = User.objects.create_user(username=username, password="carol-pw-9f2k", role=Role.VIEWER)
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def browser(path: str, session_id: str) -> WebsocketCommunicator:
    headers = [
        (b"origin", b"http://127.0.0.1"),
        (b"host", b"127.0.0.1"),
        (b"cookie", f"sessionid={session_id}".encode()),
    ]
    return WebsocketCommunicator(application, path, headers=headers)


def deactivate(user: User) -> None:
    User.objects.filter(pk=user.pk).update(is_active=False)


def sign_out_everywhere(user: User) -> None:
    Session.objects.all().delete()


def change_password(user: User) -> None:
    user.set_password("another-pw-7h3j")  # the session's auth hash no longer matches
    user.save()


REVOCATIONS: dict[str, Callable[[User], None]] = {
    "deactivated": deactivate,
    "signed out": sign_out_everywhere,
    "password changed": change_password,
}


@pytest.mark.parametrize("how", list(REVOCATIONS))
async def test_it_closes_an_open_socket_once_its_user_loses_access(host: Host, how: str) -> None:
    user, session_id = await signed_in()
    d0 = await database_sync_to_async(lambda: Device.objects.filter(host=host).order_by("index").first())()
    assert d0 is not None
    with QUICK_RECHECK:
        comm = browser("/ws/dashboard/overview/", session_id)
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
        # Still allowed: re-checks (every 0.1 s, before each push) let the next change through.
        await database_sync_to_async(add_device_sample)(d0, memory_used_bytes=20 * GIB)
        assert (await comm.receive_json_from(timeout=5))["type"] == "delta"

        await database_sync_to_async(REVOCATIONS[how])(user)
        await database_sync_to_async(add_device_sample)(d0, memory_used_bytes=33 * GIB)
        # The change is not pushed: the socket is closed instead.
        assert await comm.receive_output(timeout=5) == {
            "type": "websocket.close",
            "code": CLOSE_ACCESS_REVOKED,
        }
        await comm.disconnect()


async def test_the_log_socket_closes_and_stops_asking_for_tails_once_the_user_is_signed_out(
    deployment: Deployment,
) -> None:
    _, session_id = await signed_in()
    layer = get_channel_layer()
    agent = await layer.new_channel()
    await layer.group_add(agent_group(deployment.host_id), agent)
    with QUICK_RECHECK:
        comm = browser(f"/ws/dashboard/deployments/{deployment.pk}/logs/", session_id)
        assert (await comm.connect())[0]
        command = (await layer.receive(agent))["frame"]
        assert command["action"] == "tail_log"

        await database_sync_to_async(Session.objects.all().delete)()
        assert await comm.receive_output(timeout=5) == {
            "type": "websocket.close",
            "code": CLOSE_ACCESS_REVOKED,
        }
        # An agent's answer still in flight is not pushed to the closed socket.
        await layer.group_send(
            f"agents.logs.{deployment.pk}",
            {"type": "log.tail", "deployment_id": str(deployment.pk), "lines": ["x"]},
        )
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()
