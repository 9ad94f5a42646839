"""Limits on failed sign-ins, per username and per client address.

Every password check goes through ``accounts.backends.RateLimitedModelBackend``: the sign-in page
(/accounts/login/), the admin's (/admin/login/) and ``POST /api/v1/auth/token/`` alike. A username
with LOGIN_FAILURES_PER_USERNAME failures, or a client address with LOGIN_FAILURES_PER_ADDRESS,
within LOGIN_FAILURE_WINDOW_S of its first failure is refused before any password is checked until
that window ends. A successful sign-in clears its username's failures (not its address's).

The address is ``REMOTE_ADDR``: behind a reverse proxy, run daphne with ``--proxy-headers`` or every
client shares the proxy's address (and its limit).

Counts live in Django's default cache. With the local-memory cache (the default; settings configure
no CACHES) each process counts on its own, so N web processes allow up to N times the limits, and a
restart forgets them.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError

logger = logging.getLogger(__name__)


class SignInLocked(ValidationError):
    """Too many failed sign-ins for the username or from the address; ``retry_after_s`` until the
    window ends.

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
    key: str  # cache key of the failure count; its window start is under f"{key}:since"
    limit: int
    whose: str  # for the message: "for this username", "from this address"


def check(request: Any, username: str | None) -> None:
    """Raise SignInLocked when the username or the client's address has no failures left.

    Called before the password is checked.
    """
    for budget in _budgets(request, username):
        found = cache.get_many([budget.key, f"{budget.key}:since"])
        if found.get(budget.key, 0) < budget.limit:
            continue
        window = settings.LOGIN_FAILURE_WINDOW_S
        since = found.get(f"{budget.key}:since", time.time())
        retry_after_s = max(1, math.ceil(since + window - time.time()))
        logger.warning(
            "refused sign-in as %r from %s: too many failed sign-ins %s (%d s left)",
            _shown(username),
            client_address(request),
            budget.whose,
            retry_after_s,
        )
        raise SignInLocked(budget.whose, retry_after_s)


def record_failure(request: Any, username: str | None) -> None:
    """Count a failed sign-in against the username and the client's address."""
    window = settings.LOGIN_FAILURE_WINDOW_S
    for budget in _budgets(request, username):
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


def clear_username(username: str) -> None:
    """Forget the username's failures (it just signed in)."""
    key = _key("username", username.casefold())
    cache.delete_many([key, f"{key}:since"])


def client_address(request: Any) -> str | None:
    """The client's address (``REMOTE_ADDR``); ``None`` without a request."""
    return None if request is None else request.META.get("REMOTE_ADDR") or None


def _budgets(request: Any, username: str | None) -> list[_Budget]:
    budgets = []
    if username:
        # Case-folded: another spelling of a username does not get a budget of its own.
        key = _key("username", username.casefold())
        budgets.append(_Budget(key, settings.LOGIN_FAILURES_PER_USERNAME, "for this username"))
    address = client_address(request)
    if address:
        budgets.append(
            _Budget(_key("address", address), settings.LOGIN_FAILURES_PER_ADDRESS, "from this address")
        )
    return budgets


def _key(kind: str, value: str) -> str:
    # Hashed: usernames are user input, and some cache backends refuse spaces or long keys.
    return f"signin-failures:{kind}:{hashlib.sha256(value.encode()).hexdigest()}"


def _shown(username: str | None) -> str | None:
    return None if username is None else username[:150]
