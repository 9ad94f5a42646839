"""A user holds at most DASHBOARD_SOCKETS_PER_USER dashboard sockets open; one more is closed with
4429, and a socket's slot is freed however it ends (closed, refused, its handler raising).

Each socket re-reads the database every second: before the cap, one user could open any number.
Driven through the real ASGI stack (session cookie, Origin check) like a browser.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
from accounts.models import User
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from dashboard import socket_slots
from dashboard.consumers import JobsConsumer
from dashboard.socket_slots import CLOSE_TOO_MANY_SOCKETS
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.test import Client, override_settings

from config.asgi import application

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("close_worker_thread_connections"),
]

ROOT = Path(__file__).resolve().parents[2]
CAP_OF_TWO = override_settings(DASHBOARD_SOCKETS_PER_USER=2)
needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="the shared count: needs REDIS_URL")


@database_sync_to_async
def session_of(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def browser(session_id: str, path: str = "/ws/dashboard/jobs/") -> WebsocketCommunicator:
    headers = [
        (b"origin", b"http://127.0.0.1"),
        (b"host", b"127.0.0.1"),
        (b"cookie", f"sessionid={session_id}".encode()),
    ]
    return WebsocketCommunicator(application, path, headers=headers)


async def opened(session_id: str) -> WebsocketCommunicator:
    comm = browser(session_id)
    assert (await comm.connect(timeout=10))[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "snapshot"
    return comm


async def assert_refused_as_too_many(session_id: str) -> None:
    comm = browser(session_id)
    assert (await comm.connect(timeout=10))[0]  # accepted, so that the close code reaches the page
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_TOO_MANY_SOCKETS}
    await comm.wait(timeout=5)


async def held(user: User) -> int:
    return await sync_to_async(socket_slots.held)(user.pk)


async def test_it_closes_a_users_sockets_past_the_cap_with_4429(viewer_user: User, admin_user: User) -> None:
    viewer, admin = await session_of(viewer_user), await session_of(admin_user)
    with CAP_OF_TWO:
        first, second = await opened(viewer), await opened(viewer)
        await assert_refused_as_too_many(viewer)
        other = await opened(admin)  # the cap is each user's own
        assert await held(viewer_user) == 2

        await first.disconnect()  # a closed socket frees its slot
        third = await opened(viewer)
        await assert_refused_as_too_many(viewer)
        for comm in (second, third, other):
            await comm.disconnect()
    assert await held(viewer_user) == 0 and await held(admin_user) == 0


async def test_a_refused_handshake_frees_its_slot(viewer_user: User) -> None:
    viewer = await session_of(viewer_user)
    with override_settings(DASHBOARD_SOCKETS_PER_USER=1):
        for _ in range(3):  # no such job: refused after taking a slot
            comm = browser(viewer, "/ws/dashboard/jobs/999999/")
            assert not (await comm.connect(timeout=10))[0]
            await comm.wait(timeout=5)
        assert await held(viewer_user) == 0
        await (await opened(viewer)).disconnect()


# The layer's group table is the in-memory layer's: this is about the consumer's clean-up.
@override_settings(CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}})
async def test_a_socket_whose_handler_raises_frees_its_slot(viewer_user: User) -> None:
    viewer = await session_of(viewer_user)
    with override_settings(DASHBOARD_SOCKETS_PER_USER=1):
        comm = await opened(viewer)
        # A message without a handler makes dispatch raise: daphne would close the socket with 1011
        # and never call disconnect().
        await get_channel_layer().group_send("dashboard.jobs", {"type": "no.such.handler"})
        with pytest.raises(ValueError, match="No handler"):
            await comm.wait(timeout=5)
        assert await held(viewer_user) == 0
        await (await opened(viewer)).disconnect()


async def test_a_socket_whose_first_read_raises_frees_its_slot(
    viewer_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    viewer = await session_of(viewer_user)

    async def broken(self: JobsConsumer) -> Any:
        raise RuntimeError("the first read failed")

    with override_settings(DASHBOARD_SOCKETS_PER_USER=1):
        monkeypatch.setattr(JobsConsumer, "read", broken)
        comm = browser(viewer)
        with pytest.raises(RuntimeError, match="first read"):
            await comm.connect(timeout=10)
            await comm.wait(timeout=5)
        monkeypatch.undo()
        assert await held(viewer_user) == 0
        await (await opened(viewer)).disconnect()


def leases_run_out(user: User) -> None:
    """Age every lease of the user's slots past its end, as LEASE_S seconds without renewal do."""
    backend = caches["default"]
    assert isinstance(backend, RedisCache)
    key = backend.make_and_validate_key(f"dashboard-sockets:{user.pk}")
    client = backend._cache.get_client(key, write=True)
    client.zadd(key, {cast(bytes, member): time.time() - 1 for member in client.zrange(key, 0, -1)})


@needs_redis
async def test_with_redis_the_cap_counts_every_processs_sockets_and_a_dead_ones_expire(
    viewer_user: User,
) -> None:
    """Another web process holds the viewer's two sockets and dies without closing them: this one
    refuses a third, until their leases run out."""
    viewer = await session_of(viewer_user)
    code = (
        "import asyncio, django; django.setup(); from dashboard import socket_slots; "
        f"assert all(asyncio.run(socket_slots.take({viewer_user.pk})) for _ in range(2))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DASHBOARD_SOCKETS_PER_USER": "2",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    with CAP_OF_TWO:
        assert await held(viewer_user) == 2
        await assert_refused_as_too_many(viewer)
        await sync_to_async(leases_run_out)(viewer_user)
        comm = await opened(viewer)
        assert await held(viewer_user) == 1
        await comm.disconnect()
    assert await held(viewer_user) == 0


@needs_redis
async def test_with_redis_an_open_socket_renews_its_lease(
    viewer_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket_slots, "RENEW_S", 0)  # at every tick (1 s) instead of every 20 s
    viewer = await session_of(viewer_user)
    with override_settings(DASHBOARD_SOCKETS_PER_USER=1):
        comm = await opened(viewer)
        await sync_to_async(leases_run_out)(viewer_user)
        assert await held(viewer_user) == 0
        for _ in range(40):
            await asyncio.sleep(0.1)
            if await held(viewer_user) == 1:
                break
        assert await held(viewer_user) == 1  # renewed: still counted, its lease ends in a minute
        await assert_refused_as_too_many(viewer)
        await comm.disconnect()


@needs_redis
async def test_with_redis_a_renewal_still_running_when_the_socket_closes_does_not_take_its_slot_again(
    viewer_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal runs in a worker thread, which cancelling the socket's polling task does not stop:
    one that lands after the close's give-back must not put the freed slot back for LEASE_S."""
    renewing = asyncio.Event()
    loop = asyncio.get_running_loop()
    renew_shared = socket_slots._renew_shared

    def slow_renew(backend: RedisCache, slot: socket_slots.Slot) -> None:
        loop.call_soon_threadsafe(renewing.set)
        time.sleep(0.5)
        renew_shared(backend, slot)

    monkeypatch.setattr(socket_slots, "RENEW_S", 0)
    monkeypatch.setattr(socket_slots, "_renew_shared", slow_renew)
    viewer = await session_of(viewer_user)
    comm = await opened(viewer)
    await asyncio.wait_for(renewing.wait(), timeout=5)
    await comm.disconnect()
    await asyncio.sleep(1)  # the renewal's thread has finished
    assert await held(viewer_user) == 0
