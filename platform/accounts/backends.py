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
        SignInLocked: from ``authenticate()``, before the password is checked.
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
        login_limits.check(request, username)
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_limits.record_failure(request, username)
        else:
            login_limits.record_success(request, username)
        return user

    async def aauthenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        return await sync_to_async(self.authenticate)(request, username=username, password=password, **kwargs)
