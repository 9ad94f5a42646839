"""With REDIS_URL the channel layer is Redis: a consumer waiting for a message longer than the
layer's 5 s BRPOP keeps waiting. redis-py 8 gives sockets a 5 s read timeout by default, which the
empty BRPOP (5 s) outlasted: every idle websocket (agent links, dashboards) closed with 1011 every
5-6 s, and the agents reconnected.

A consumer's receive also ends whenever it is cancelled (the consumer's socket closed): with a
socket timeout set, redis-py sent each command through asyncio.wait_for, which on Python 3.11 can
swallow a cancellation; about one cancel in four, landing as a command went out, was lost and the
receive popped from Redis for ever (the consumer never ended; test runs hung on it).

Runs in CI's second pass (REDIS_URL set) and skips without it.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer
from django.conf import settings

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="the production path: needs REDIS_URL")


def test_a_receive_outlasts_the_layers_blocking_pop_and_still_gets_its_message() -> None:
    async def scenario() -> dict[str, str]:
        layer = get_channel_layer()
        assert type(layer).__name__ == "RedisChannelLayer"
        channel = await layer.new_channel()
        with pytest.raises(asyncio.TimeoutError):  # nothing came: still waiting, not a socket error
            await asyncio.wait_for(layer.receive(channel), timeout=layer.brpop_timeout + 2)
        waiting = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(layer.brpop_timeout + 1)  # an idle socket's wait, past one BRPOP
        await layer.send(channel, {"type": "ping", "text": "still here"})
        message = await asyncio.wait_for(waiting, timeout=5)
        await layer.flush()
        return message

    assert asyncio.run(scenario()) == {"type": "ping", "text": "still here"}


def test_a_receive_ends_when_cancelled_wherever_the_cancel_lands() -> None:
    async def scenario() -> list[int]:
        layer = get_channel_layer()
        lost = []
        for attempt in range(48):
            receive = asyncio.ensure_future(layer.receive(await layer.new_channel()))
            for _ in range(attempt % 12):  # land the cancel at each step of sending the pop and waiting
                await asyncio.sleep(0)
            receive.cancel()
            done, _ = await asyncio.wait({receive}, timeout=2)
            if not done:
                lost.append(attempt)
                receive.cancel()  # a second cancel ends it, so the run can go on
                await asyncio.wait({receive}, timeout=10)
        await layer.flush()
        return lost

    assert asyncio.run(scenario()) == []  # the attempts whose cancel was lost
