"""The authentication backend: Django's ModelBackend behind the failed sign-in limits."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest

from accounts import login_limits
from accounts.models import User


class RateLimitedModelBackend(ModelBackend):
    """Username + password against the user table, refused while the username from the client's
    address, the address, or the username from anywhere has too many recent failures
    (accounts/login_limits.py).

    Raises:
        SignInLocked: from ``authenticate()``, before the password is checked: at most a budget's
            limit of passwords are checked in its window, however many sign-ins run at once (those
            past it while checks are in flight are told to try again in a moment).
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        # Counted before the (slow) password check, so concurrent guesses cannot all pass a count
        # at its limit. A check that raises counts as a failure: one left unfinished would hold its
        # part of the budgets as in progress until their windows end.
        attempt = login_limits.begin_attempt(request, username)
        user: User | None = None
        try:
            user = super().authenticate(request, username=username, password=password, **kwargs)
        finally:
            if user is None:
                attempt.failed()
            else:
                attempt.succeeded()
        return user

    async def aauthenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        return await sync_to_async(self.authenticate)(request, username=username, password=password, **kwargs)
