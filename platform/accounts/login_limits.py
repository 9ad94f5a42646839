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

A sign-in is counted before its password is checked (``begin_attempt``), with the cache's atomic
``incr``, and refused if that takes a count past its limit: the check is slow by design, and
sign-ins counted only after it would all pass a count at its limit while checks are in flight. So a
count lets at most its limit of passwords be checked in a window, however many sign-ins arrive
together (but for those arriving in the instant the window ends, which may each start the next
one, or be counted in one already over). A refused sign-in is taken back from every count. Then
``SignInAttempt.failed()`` keeps it counted, and ``succeeded()`` clears the count of its username
from its address and takes it back from the username's and the address's, which it does not clear
(else each sign-in of the owner would give a guesser spread over addresses a fresh budget). Without
a request (no address) only the username's count applies.

The address is ``REMOTE_ADDR``: behind a reverse proxy, run daphne with ``--proxy-headers`` or every
client shares the proxy's address (and its limits).

Counts live in Django's default cache (config/settings.py): with REDIS_URL, Redis, shared by every
process; without it each process's local memory, so N web processes allow up to N times the limits,
and a restart forgets them. ``manage.py clear_login_limits`` forgets the counts of a username, of an
address, or all of them (clear_username, clear_address, clear_all): each replaces a generation that
is part of the keys of the counts it covers, so a username's counts from every address go without
listing the addresses. A window's start is part of its count's key too, so a count never outlives
its window, and taking an attempt back after its window ended touches no later one.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import math
import secrets
import time
from collections.abc import Sequence
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
    key: str  # prefix of the count's keys; its window's start is under f"{key}:since"
    limit: int
    whose: str  # for the message: "for this username from this address", ...

    @property
    def since_key(self) -> str:
        return f"{self.key}:since"


@dataclass(frozen=True)
class _Window:
    """One window of a count: the count is under ``key``, which only this window uses."""

    budget: _Budget
    since: float  # its start, time.time()

    @property
    def key(self) -> str:
        return f"{self.budget.key}:{self.since!r}"

    def seconds_left(self, now: float) -> float:
        window_s = settings.LOGIN_FAILURE_WINDOW_S
        # At most the window: another process's (or thread's) clock may have started it after ``now``.
        return min(window_s, self.since + window_s - now)


@dataclass(frozen=True)
class SignInAttempt:
    """A sign-in counted by begin_attempt(); once its password is checked, one of failed() and
    succeeded()."""

    username: str | None
    address: str | None
    counted: tuple[tuple[_Window, int], ...]  # (window, its count with this sign-in)

    def failed(self) -> None:
        """The password was wrong: the sign-in stays counted. Logs the counts it brought to their
        limits."""
        now = time.time()
        for window, count in self.counted:
            if count == window.budget.limit:
                logger.warning(
                    "locking sign-ins for %d s: %d failures %s (as %r from %s)",
                    math.ceil(window.seconds_left(now)),
                    count,
                    window.budget.whose,
                    _shown(self.username),
                    self.address,
                )

    def succeeded(self) -> None:
        """The password was right: forget the failures of the username from the client's address,
        and take the sign-in back from the username's and the address's counts."""
        pairs = [w for w, _ in self.counted if w.budget.kind == "pair"]
        cache.delete_many([key for w in pairs for key in (w.key, w.budget.since_key)])
        _take_back([w for w, _ in self.counted if w.budget.kind != "pair"])


def begin_attempt(request: Any, username: str | None) -> SignInAttempt:
    """Count a sign-in against every count covering it; called before its password is checked.

    Raises:
        SignInLocked: a count covering it is at its limit, or this sign-in took it past (one that
            was in flight took the last attempt); the sign-in is counted nowhere. With several, the
            one that ends last.
    """
    address = client_address(request)
    budgets = _budgets(username, address)
    now = time.time()
    # A read first, which moves no count: a guesser knocking at a locked pair does not even briefly
    # spend the username's or the address's budget.
    started = cache.get_many([budget.since_key for budget in budgets])
    windows = [_Window(b, started[b.since_key]) for b in budgets if b.since_key in started]
    windows = [window for window in windows if window.seconds_left(now) > 0]
    counts = cache.get_many([window.key for window in windows])
    _refuse_past_limits(username, address, [(w, counts.get(w.key, 0) + 1) for w in windows], now)

    counted = [_count(budget, now) for budget in budgets]
    try:
        _refuse_past_limits(username, address, counted, now)
    except SignInLocked:
        _take_back([window for window, _ in counted])
        raise
    return SignInAttempt(username, address, tuple(counted))


def _count(budget: _Budget, now: float) -> tuple[_Window, int]:
    """Add a sign-in to the budget's count in its current window (a new one if none); (the window,
    its count with this sign-in)."""
    window_s = settings.LOGIN_FAILURE_WINDOW_S
    cache.add(budget.since_key, now, window_s)
    since = cache.get(budget.since_key)
    if since is None or since + window_s <= now:
        # The window is over by the clock, which the cache's expiry can trail: start the next one.
        cache.set(budget.since_key, now, window_s)
        since = now
    window = _Window(budget, since)
    timeout = max(1, math.ceil(window.seconds_left(now)))
    cache.add(window.key, 0, timeout)
    try:
        return window, cache.incr(window.key)
    except ValueError:  # the window ended between add() and incr()
        cache.set(window.key, 1, timeout)
        return window, 1


def _take_back(windows: Sequence[_Window]) -> None:
    for window in windows:
        # ValueError: the window ended, and its count with it: nothing to take the sign-in back from.
        with contextlib.suppress(ValueError):
            cache.decr(window.key)


def _refuse_past_limits(
    username: str | None, address: str | None, counts: Sequence[tuple[_Window, int]], now: float
) -> None:
    """Raise SignInLocked when a count (with this sign-in) is past its limit in a window not over."""
    past = [(math.ceil(w.seconds_left(now)), w.budget) for w, count in counts if count > w.budget.limit]
    locked = [(seconds, budget) for seconds, budget in past if seconds > 0]
    if not locked:
        return
    retry_after_s, budget = max(locked, key=lambda item: item[0])
    logger.warning(
        "refused sign-in as %r from %s: too many failed sign-ins %s (%d s left)",
        _shown(username),
        address,
        budget.whose,
        retry_after_s,
    )
    raise SignInLocked(budget.whose, retry_after_s)


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
