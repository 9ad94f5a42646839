"""Limits on failed sign-ins: per username and client address, per address, per username.

Every password check goes through ``accounts.backends.RateLimitedModelBackend``: the sign-in page
(/accounts/login/), the admin's (/admin/login/) and ``POST /api/v1/auth/token/`` alike. Three counts
of failures, each over LOGIN_FAILURE_WINDOW_S from its first failure; one at its limit refuses the
sign-ins it covers, before any password is checked, until its window ends:

- a username from one address: LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS (5). The lock a guesser
  meets, and only from the guesser's address: the owner still signs in from any other, so knowing
  a username is not enough to lock its owner out.
- an address, across usernames: LOGIN_FAILURES_PER_ADDRESS (20).
- a username, from every address together: LOGIN_FAILURES_PER_USERNAME (100), a brake on guessing
  spread over many addresses. Reaching it locks the owner out too, but takes that many attempts in
  one window.

A successful sign-in clears the count of its username from its address; the username's and the
address's stay (else each sign-in of the owner would give a guesser spread over addresses a fresh
budget). Without a request (no address) only the username's count applies.

The address is ``REMOTE_ADDR``: behind a reverse proxy, run daphne with ``--proxy-headers`` or every
client shares the proxy's address (and its limits).

Counts live in Django's default cache (config/settings.py): with REDIS_URL, Redis, shared by every
process; without it each process's local memory, so N web processes allow up to N times the limits,
and a restart forgets them. ``manage.py clear_login_limits`` forgets the counts of a username, of an
address, or all of them (clear_username, clear_address, clear_all): each replaces a generation that
is part of the keys of the counts it covers, so a username's counts from every address go without
listing the addresses.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError

logger = logging.getLogger(__name__)

_PREFIX = "signin-failures"
_NO_GENERATION = "0"  # the generation of counts never cleared


class SignInLocked(ValidationError):
    """Too many failed sign-ins for the username, from the address or both; ``retry_after_s`` until
    the window ends.

    A ValidationError because AuthenticationForm.clean() lets one raised inside authenticate()
    through to the form, which shows it as its error: both sign-in pages need no view of their own.
    (authenticate() would swallow PermissionDenied, and the form would say the password is wrong.)
    """

    def __init__(self, whose: str, retry_after_s: int) -> None:
        minutes = max(1, math.ceil(retry_after_s / 60))
        unit = "minute" if minutes == 1 else "minutes"
        super().__init__(
            f"Too many failed sign-ins {whose}; try again in {minutes} {unit}.", code="signin_locked"
        )
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class _Budget:
    kind: str  # "pair", "username" or "address"
    key: str  # cache key of the failure count; its window start is under f"{key}:since"
    limit: int
    whose: str  # for the message: "for this username from this address", ...


def check(request: Any, username: str | None) -> None:
    """Raise SignInLocked when any count covering this sign-in is at its limit.

    Called before the password is checked. With several at their limits, the one that ends last.
    """
    budgets = _budgets(username, client_address(request))
    found = cache.get_many([key for budget in budgets for key in (budget.key, f"{budget.key}:since")])
    now = time.time()
    window = settings.LOGIN_FAILURE_WINDOW_S
    # (seconds left, budget) of the counts at their limits; a window over by the clock is over even
    # where the cache has not expired its count yet.
    left = [(found.get(f"{b.key}:since", now) + window - now, b) for b in budgets]
    locked = [(math.ceil(s), b) for s, b in left if found.get(b.key, 0) >= b.limit and s > 0]
    if not locked:
        return
    retry_after_s, budget = max(locked, key=lambda item: item[0])
    logger.warning(
        "refused sign-in as %r from %s: too many failed sign-ins %s (%d s left)",
        _shown(username),
        client_address(request),
        budget.whose,
        retry_after_s,
    )
    raise SignInLocked(budget.whose, retry_after_s)


def record_failure(request: Any, username: str | None) -> None:
    """Count a failed sign-in against every count covering it."""
    window = settings.LOGIN_FAILURE_WINDOW_S
    for budget in _budgets(username, client_address(request)):
        cache.add(f"{budget.key}:since", time.time(), window)
        cache.add(budget.key, 0, window)
        try:
            failures = cache.incr(budget.key)
        except ValueError:  # the window ended between add() and incr()
            cache.set(budget.key, 1, window)
            failures = 1
        if failures == budget.limit:
            logger.warning(
                "locking sign-ins for %d s: %d failures %s (as %r from %s)",
                window,
                failures,
                budget.whose,
                _shown(username),
                client_address(request),
            )


def record_success(request: Any, username: str) -> None:
    """Forget the failures of the username from the client's address (it just signed in)."""
    pairs = [b for b in _budgets(username, client_address(request)) if b.kind == "pair"]
    cache.delete_many([key for budget in pairs for key in (budget.key, f"{budget.key}:since")])


def clear_username(username: str) -> None:
    """Forget the failures of the username (any spelling), its own and from every address."""
    cache.set(_generation_key("username", username.casefold()), secrets.token_hex(8), None)


def clear_address(address: str) -> None:
    """Forget the failures from the address, its own and for every username.

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    cache.set(_generation_key("address", normalized_address(address)), secrets.token_hex(8), None)


def clear_all() -> None:
    """Forget every failed sign-in (and nothing else the cache holds)."""
    cache.set(_generation_key(), secrets.token_hex(8), None)


def client_address(request: Any) -> str | None:
    """The client's address (``REMOTE_ADDR``, an IP address in its shortest form); ``None`` without
    a request."""
    address = None if request is None else request.META.get("REMOTE_ADDR") or None
    if address is None:
        return None
    try:
        return normalized_address(address)
    except ValueError:
        return str(address)  # not an IP address (a Unix socket's peer): counted as it is


def normalized_address(address: str) -> str:
    """``address`` in the form the counts use ("::1" for "0:0:0:0:0:0:0:1").

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    return ipaddress.ip_address(address.strip()).compressed


def _budgets(username: str | None, address: str | None) -> list[_Budget]:
    # Case-folded: another spelling of a username does not get a budget of its own.
    user = username.casefold() if username else None
    generation_keys = {
        "all": _generation_key(),
        "username": _generation_key("username", user) if user else None,
        "address": _generation_key("address", address) if address else None,
    }
    found = cache.get_many([key for key in generation_keys.values() if key])
    # kind -> generation of its counts; "all" is part of every key.
    gen = {kind: str(found.get(key, _NO_GENERATION)) for kind, key in generation_keys.items() if key}
    budgets = []
    if user and address:
        key = _key(gen["all"], "pair", _digest(user, address), gen["username"], gen["address"])
        whose = "for this username from this address"
        budgets.append(_Budget("pair", key, settings.LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS, whose))
    if user:
        key = _key(gen["all"], "username", _digest(user), gen["username"])
        budgets.append(_Budget("username", key, settings.LOGIN_FAILURES_PER_USERNAME, "for this username"))
    if address:
        key = _key(gen["all"], "address", _digest(address), gen["address"])
        budgets.append(_Budget("address", key, settings.LOGIN_FAILURES_PER_ADDRESS, "from this address"))
    return budgets


def _generation_key(kind: str | None = None, value: str | None = None) -> str:
    if kind is None:
        return f"{_PREFIX}:generation"
    return f"{_PREFIX}:generation:{kind}:{_digest(value or '')}"


def _key(*parts: str) -> str:
    return ":".join((_PREFIX, *parts))


def _digest(*values: str) -> str:
    # Hashed: usernames are user input, and some cache backends refuse spaces or long keys.
    return hashlib.sha256("\0".join(values).encode()).hexdigest()


def _shown(username: str | None) -> str | None:
    return None if username is None else username[:150]
