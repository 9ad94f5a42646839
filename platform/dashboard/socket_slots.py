"""How many dashboard websockets each user holds open: at most DASHBOARD_SOCKETS_PER_USER.

Every open socket re-reads the database about once a second (dashboard/consumers.py), so without a
cap one user (a script, or a page reloaded in a loop by a hostile tab) could hold any number of
them and keep the database busy. A socket takes a slot before it reads anything; past the cap it
is closed with 4429 (``CLOSE_TOO_MANY_SOCKETS``). Its slot is given back however it ends
(`LiveConsumer.__call__` releases it, also when a handler raises).

Where the slots are counted follows the cache (config/settings.py, as accounts/login_limits.py):

- with Redis (REDIS_URL or CACHE_URL), one sorted set per user in the cache's database, shared by
  every web process: each socket is a member scored with the time its lease ends. A socket renews
  its lease every ``RENEW_S`` while it is open (`renew`), so the slots of a process that died
  without closing its sockets (killed, its host gone) are freed ``LEASE_S`` later, when the next
  socket of that user counts; a take is one script (drop expired leases, count, add), so sockets
  opened at once in several processes cannot pass the cap together.
- with the local-memory cache (no Redis), in this process's memory: each process has its own cap,
  so N web processes allow up to N times DASHBOARD_SOCKETS_PER_USER sockets per user.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.redis import RedisCache

# Close code of a socket past its user's cap: 429's. live.js says so and retries slowly.
CLOSE_TOO_MANY_SOCKETS = 4429
LEASE_S = 60  # how long a slot outlives the last renewal of a socket that is gone without a word
RENEW_S = 20  # how often an open socket renews its slot's lease (several times per lease)
_PREFIX = "dashboard-sockets"

# KEYS[1]: the user's set. ARGV: now, the new lease's end, the cap, the socket's id, LEASE_S.
# Returns 1 with the slot taken, 0 when the user's unexpired leases already fill the cap.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""
# KEYS[1]: the user's set. ARGV: the lease's new end, the socket's id, LEASE_S.
_RENEW = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

_local: dict[int, set[str]] = {}  # user pk -> ids of this process's sockets (without Redis)


@dataclass(frozen=True)
class Slot:
    """One open socket's place among its user's."""

    user_pk: int
    id: str


def _redis() -> RedisCache | None:
    backend = caches[DEFAULT_CACHE_ALIAS]
    return backend if isinstance(backend, RedisCache) else None


def _key(backend: RedisCache, user_pk: int) -> str:
    return str(backend.make_and_validate_key(f"{_PREFIX}:{user_pk}"))


def _take_shared(backend: RedisCache, slot: Slot, cap: int) -> bool:
    key = _key(backend, slot.user_pk)
    client = backend._cache.get_client(key, write=True)
    now = time.time()
    return bool(client.eval(_TAKE, 1, key, now, now + LEASE_S, cap, slot.id, LEASE_S))


def _renew_shared(backend: RedisCache, slot: Slot) -> None:
    key = _key(backend, slot.user_pk)
    client = backend._cache.get_client(key, write=True)
    client.eval(_RENEW, 1, key, time.time() + LEASE_S, slot.id, LEASE_S)


def _give_back_shared(backend: RedisCache, slot: Slot) -> None:
    key = _key(backend, slot.user_pk)
    backend._cache.get_client(key, write=True).zrem(key, slot.id)


async def take(user_pk: int) -> Slot | None:
    """A slot for a new socket of the user, or None when their open sockets fill the cap."""
    slot = Slot(user_pk, uuid.uuid4().hex)
    cap = int(settings.DASHBOARD_SOCKETS_PER_USER)
    backend = _redis()
    if backend is not None:
        taken = await sync_to_async(_take_shared, thread_sensitive=False)(backend, slot, cap)
        return slot if taken else None
    held = _local.setdefault(user_pk, set())  # no await from here: no other socket runs meanwhile
    if len(held) >= cap:
        return None
    held.add(slot.id)
    return slot


async def renew(slot: Slot) -> None:
    """Extend the slot's lease (shared slots only; a process's own end with it)."""
    backend = _redis()
    if backend is not None:
        await sync_to_async(_renew_shared, thread_sensitive=False)(backend, slot)


async def give_back(slot: Slot) -> None:
    """Free the slot; one already free is left as it is."""
    backend = _redis()
    if backend is not None:
        await sync_to_async(_give_back_shared, thread_sensitive=False)(backend, slot)
        return
    held = _local.get(slot.user_pk)
    if held is not None:
        held.discard(slot.id)
        if not held:
            del _local[slot.user_pk]


def held(user_pk: int) -> int:
    """How many slots the user holds now (unexpired leases with Redis), for tests and logs."""
    backend = _redis()
    if backend is None:
        return len(_local.get(user_pk, ()))
    key = _key(backend, user_pk)
    return int(backend._cache.get_client(key).zcount(key, f"({time.time()}", "+inf"))
