"""Limits on failed sign-ins: per username and client address, per address, per username.

Every password check goes through ``accounts.backends.RateLimitedModelBackend``: the sign-in page
(/accounts/login/), the admin's (/admin/login/) and ``POST /api/v1/auth/token/`` alike. Three
budgets, each over LOGIN_FAILURE_WINDOW_S from its first sign-in; one whose failures reach its limit
refuses the sign-ins it covers, before any password is checked, until its window ends:

- a username from one address: LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS (5). The lock a guesser
  meets, and only from the guesser's address: the owner still signs in from any other, so knowing
  a username is not enough to lock its owner out.
- an address, across usernames: LOGIN_FAILURES_PER_ADDRESS (20).
- a username, from every address together: LOGIN_FAILURES_PER_USERNAME (100), a brake on guessing
  spread over many addresses. Reaching it locks the owner out too, but takes that many attempts in
  one window.

A budget's window keeps two counts, with the cache's atomic increments:

- attempts: sign-ins whose password is being checked or was wrong. A sign-in is added before its
  password is checked (``begin_attempt``), and refused, and taken back, if that takes the count
  past its limit: the check is slow by design, and sign-ins counted only after it would all pass a
  count at its limit while checks are in flight. So at most the limit's number of passwords are
  checked in a window, however many sign-ins arrive together (but for those arriving in the
  instant the window ends, which may each start the next one, or be counted in one already over).
- failures: the wrong passwords among them, added by ``SignInAttempt.failed()``.

A refusal tells the two apart. Failures at the limit: "Too many failed sign-ins ...", with the rest
of the window as ``SignInLocked.retry_after_s`` (the token endpoint's Retry-After). Attempts past
it with failures below: only checks in flight fill the budget (a script fetching tokens in
parallel, an office behind one NAT), and each leaves it when it ends: "Too many sign-ins in
progress ...; try again in a moment", retry_after_s 1. ``succeeded()`` takes its sign-in back from
the username's and the address's attempts (its success spends no budget, and their failures stay,
else each sign-in of the owner would give a guesser spread over addresses a fresh budget) and
clears the window of its username from its address. A check that raises counts as a failure; one
whose process dies mid-check stays in progress until its window ends. Without a request (no
address) only the username's budget applies.

The address is ``REMOTE_ADDR``: behind a reverse proxy, run daphne with ``--proxy-headers`` or every
client shares the proxy's address (and its limits).

Counts live in Django's default cache (config/settings.py): with REDIS_URL, Redis, shared by every
process; without it each process's local memory, so N web processes allow up to N times the limits,
and a restart forgets them. Every count expires with its window: on Redis it is added to and given
its expiry in one script (Django's ``incr()`` is EXISTS then INCRBY, which recreates a count that
expired in between with no expiry). ``manage.py clear_login_limits`` forgets the counts of a
username, of an address, or all of them (clear_username, clear_address, clear_all): each replaces a
generation that is part of the keys of the counts it covers, so a username's counts from every
address go without listing the addresses. A window's start is part of its counts' keys too, so a
count never outlives its window, and taking an attempt back after its window ended touches no later
one.
"""

from __future__ import annotations

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
from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ValidationError

logger = logging.getLogger(__name__)

_PREFIX = "signin-failures"
_NO_GENERATION = "0"  # the generation of counts never cleared
_IN_PROGRESS_RETRY_AFTER_S = 1  # Retry-After's least; a check in flight ends within about that

# Adds to a count on Redis and sets its expiry in one step. KEYS[1]: the count; ARGV: the amount,
# the seconds it has to live, "1" to create it when it is not there ("0": leave it so, return nil).
_ADD_TO_COUNT = """
if ARGV[3] == '0' and redis.call('EXISTS', KEYS[1]) == 0 then
    return nil
end
local count = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return count
"""


class SignInLocked(ValidationError):
    """A sign-in refused before its password is checked, for ``retry_after_s``: too many failed
    sign-ins for the username, from the address or both (until the window ends), or, when
    ``in_progress``, too many being checked at once (a moment).

    A ValidationError because AuthenticationForm.clean() lets one raised inside authenticate()
    through to the form, which shows it as its error: both sign-in pages need no view of their own.
    (authenticate() would swallow PermissionDenied, and the form would say the password is wrong.)
    """

    def __init__(self, whose: str, retry_after_s: int, *, in_progress: bool = False) -> None:
        if in_progress:
            message = f"Too many sign-ins in progress {whose}; try again in a moment."
        else:
            minutes = max(1, math.ceil(retry_after_s / 60))
            unit = "minute" if minutes == 1 else "minutes"
            message = f"Too many failed sign-ins {whose}; try again in {minutes} {unit}."
        super().__init__(message, code="signin_in_progress" if in_progress else "signin_locked")
        self.retry_after_s = retry_after_s
        self.in_progress = in_progress


@dataclass(frozen=True)
class _Budget:
    kind: str  # "pair", "username" or "address"
    key: str  # prefix of its counts' keys; its window's start is under f"{key}:since"
    limit: int
    whose: str  # for the message: "for this username from this address", ...

    @property
    def since_key(self) -> str:
        return f"{self.key}:since"


@dataclass(frozen=True)
class _Window:
    """One window of a budget: its counts are under keys that only this window uses."""

    budget: _Budget
    since: float  # its start, time.time()

    @property
    def attempts_key(self) -> str:
        return f"{self.budget.key}:{self.since!r}"

    @property
    def failures_key(self) -> str:
        return f"{self.attempts_key}:failures"

    def seconds_left(self, now: float) -> float:
        window_s = settings.LOGIN_FAILURE_WINDOW_S
        # At most the window: another process's (or thread's) clock may have started it after ``now``.
        return min(window_s, self.since + window_s - now)

    def ttl_s(self, now: float) -> int:
        """How long its counts are kept: the rest of the window, at least a second."""
        return max(1, math.ceil(self.seconds_left(now)))


@dataclass(frozen=True)
class SignInAttempt:
    """A sign-in counted by begin_attempt(); once its password is checked, one of failed() and
    succeeded()."""

    username: str | None
    address: str | None
    counted: tuple[_Window, ...]  # the windows whose attempts count it

    def failed(self) -> None:
        """The password was wrong (or its check raised): the sign-in stays among the attempts, and
        is added to the failures. Logs the failures it brought to their limits."""
        now = time.time()
        for window in self.counted:
            if window.seconds_left(now) <= 0:
                continue  # the window ended, and its counts with it
            failures = _add(window.failures_key, 1, window.ttl_s(now), create=True)
            if failures == window.budget.limit:
                logger.warning(
                    "locking sign-ins for %d s: %d failures %s (as %r from %s)",
                    math.ceil(window.seconds_left(now)),
                    failures,
                    window.budget.whose,
                    _shown(self.username),
                    self.address,
                )

    def succeeded(self) -> None:
        """The password was right: clear the window of the username from the client's address, and
        take the sign-in back from the username's and the address's attempts."""
        pairs = [w for w in self.counted if w.budget.kind == "pair"]
        cache.delete_many([k for w in pairs for k in (w.attempts_key, w.failures_key, w.budget.since_key)])
        _take_back([w for w in self.counted if w.budget.kind != "pair"], time.time())


def begin_attempt(request: Any, username: str | None) -> SignInAttempt:
    """Count a sign-in among the attempts of every budget covering it; called before its password is
    checked.

    Raises:
        SignInLocked: a budget covering it has its limit of failures in its window, or this sign-in
            took its attempts past the limit (checks in flight hold the rest: ``in_progress``); the
            sign-in is counted nowhere. With several, the failures that end last, before any checks
            in progress.
    """
    address = client_address(request)
    budgets = _budgets(username, address)
    now = time.time()
    # A read first, which moves no count: a guesser knocking at a locked pair does not even briefly
    # spend the username's or the address's budget.
    started = cache.get_many([budget.since_key for budget in budgets])
    windows = [_Window(b, started[b.since_key]) for b in budgets if b.since_key in started]
    windows = [window for window in windows if window.seconds_left(now) > 0]
    found = cache.get_many([key for w in windows for key in (w.attempts_key, w.failures_key)])
    counts = [(w, found.get(w.attempts_key, 0) + 1, found.get(w.failures_key, 0)) for w in windows]
    _refuse_past_limits(username, address, counts, now)

    counted = [_count(budget, now) for budget in budgets]
    if any(attempts > window.budget.limit for window, attempts in counted):
        _take_back([window for window, _ in counted], now)
        failures = cache.get_many([window.failures_key for window, _ in counted])
        counts = [(w, attempts, failures.get(w.failures_key, 0)) for w, attempts in counted]
        _refuse_past_limits(username, address, counts, now)  # raises: an attempts count is past
    return SignInAttempt(username, address, tuple(window for window, _ in counted))


def _count(budget: _Budget, now: float) -> tuple[_Window, int]:
    """Add a sign-in to the budget's attempts in its current window (a new one if none); (the
    window, its attempts with this sign-in)."""
    window_s = settings.LOGIN_FAILURE_WINDOW_S
    cache.add(budget.since_key, now, window_s)
    since = cache.get(budget.since_key)
    if since is None or since + window_s <= now:
        # The window is over by the clock, which the cache's expiry can trail: start the next one.
        cache.set(budget.since_key, now, window_s)
        since = now
    window = _Window(budget, since)
    return window, _add(window.attempts_key, 1, window.ttl_s(now), create=True)


def _take_back(windows: Sequence[_Window], now: float) -> None:
    for window in windows:
        # Not from a count that is gone (its window ended, or a success cleared it): it would be
        # recreated below zero.
        _add(window.attempts_key, -1, window.ttl_s(now), create=False)


def _add(key: str, amount: int, ttl_s: int, *, create: bool) -> int:
    """Add ``amount`` to the count under ``key`` and keep it ``ttl_s`` more seconds; the count after.

    Args:
        create: start a count that is not there at 0; else leave it so, and return 0.
    """
    backend = caches[DEFAULT_CACHE_ALIAS]
    if isinstance(backend, RedisCache):
        # One script, not incr(): that is EXISTS then INCRBY, and a count that expires (or is
        # deleted) in between comes back from INCRBY with no expiry, to stay forever.
        client = backend._cache.get_client(key, write=True)
        redis_key = backend.make_and_validate_key(key)
        return int(client.eval(_ADD_TO_COUNT, 1, redis_key, amount, ttl_s, int(create)) or 0)
    # The local-memory cache (the only other one config/settings.py sets up): incr() adds under its
    # lock and keeps the expiry.
    if create:
        backend.add(key, 0, ttl_s)
    try:
        return backend.incr(key, amount)
    except ValueError:  # not there: never started, or it expired since add()
        if create:
            backend.set(key, amount, ttl_s)
            return amount
        return 0


def _refuse_past_limits(
    username: str | None, address: str | None, counts: Sequence[tuple[_Window, int, int]], now: float
) -> None:
    """Raise SignInLocked when a window not over has its limit of failures, or attempts past it.

    Args:
        counts: (window, its attempts with this sign-in, its failures) of each budget.
    """
    failed = [(math.ceil(w.seconds_left(now)), w.budget) for w, _, fails in counts if fails >= w.budget.limit]
    locked = [(seconds, budget) for seconds, budget in failed if seconds > 0]
    if locked:
        retry_after_s, budget = max(locked, key=lambda item: item[0])
        logger.warning(
            "refused sign-in as %r from %s: too many failed sign-ins %s (%d s left)",
            _shown(username),
            address,
            budget.whose,
            retry_after_s,
        )
        raise SignInLocked(budget.whose, retry_after_s)
    # Attempts past the limit with failures below it: checks in flight hold the rest of the budget,
    # and each gives its part back (or fails) within a moment.
    full = [w.budget for w, attempts, _ in counts if attempts > w.budget.limit]
    if full:
        logger.info(
            "refused sign-in as %r from %s: too many sign-ins in progress %s",
            _shown(username),
            address,
            full[0].whose,
        )
        raise SignInLocked(full[0].whose, _IN_PROGRESS_RETRY_AFTER_S, in_progress=True)


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
