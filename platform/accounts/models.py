"""Users with a platform role, operator API tokens and end-user API keys.

Secrets (tokens and keys) are stored as SHA-256 digests with a short display prefix; the
plaintext is returned once, when issued (see core/secrets.py and accounts/services.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator
from django.db import models, transaction

from core.validators import no_control_characters


class Role(models.TextChoices):
    ADMIN = "admin", "Admin (read and write)"
    VIEWER = "viewer", "Viewer (read-only)"


class User(AbstractUser):
    """A platform user. ``role`` decides what the API lets them do; superusers count as admins.

    Changing the password (``set_password`` then ``save``: the password change page, the admin's
    form, ``manage.py changepassword``) or disabling it (``set_unusable_password``: the admin's
    "password-based authentication: disabled") deletes the user's operator API tokens, as Django
    ends the user's other sessions then: a token issued with a leaked password must not outlive the
    new one (users cannot list or revoke their tokens themselves). A hash upgrade on sign-in is no
    change, and neither is a save whose ``update_fields`` leave the password out.

    Deleting a user locks its row (FOR UPDATE) before anything else, as ``lock_users`` does for the
    admin's bulk delete: whatever issues the user a credential locks that row first too
    (``accounts.services``), so a delete and an issue run one after the other instead of each
    waiting for rows the other holds (PostgreSQL would abort one with "deadlock detected").
    """

    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    _password_disabled = False

    def set_unusable_password(self) -> None:
        super().set_unusable_password()
        self._password_disabled = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        # set_password() keeps the raw password in _password until AbstractBaseUser.save() has run
        # (check_password()'s hash upgrade clears it first); a new user has no tokens yet.
        update_fields = kwargs.get("update_fields")
        written = update_fields is None or "password" in update_fields
        pending = getattr(self, "_password", None) is not None or self._password_disabled
        password_changed = pending and written and not self._state.adding
        with transaction.atomic():
            super().save(*args, **kwargs)
            if password_changed:
                ApiToken.objects.filter(user=self).delete()
        if written:
            self._password_disabled = False

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        with transaction.atomic():
            lock_users([self.pk])
            return super().delete(*args, **kwargs)


def lock_users(pks: Iterable[Any]) -> None:
    """Lock these users' rows FOR UPDATE, in primary-key order, until the caller's transaction ends
    (a user's delete takes this lock before its cascade touches the user's tokens and keys)."""
    list(User.objects.select_for_update().filter(pk__in=list(pks)).order_by("pk").values_list("pk"))


class ApiToken(models.Model):
    """A bearer token an operator (or a script) uses instead of a session for the REST API."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, validators=[no_control_characters])
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"


class ApiKey(models.Model):
    """An end user's key for the OpenAI-compatible chat gateway, with quotas."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, validators=[no_control_characters])
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    requests_per_minute = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tokens_per_day = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(requests_per_minute__gte=1), name="apikey_rpm_positive"
            ),
            models.CheckConstraint(condition=models.Q(tokens_per_day__gte=1), name="apikey_tpd_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"
