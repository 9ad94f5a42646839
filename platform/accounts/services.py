"""Issuing, checking and revoking operator API tokens and end-user API keys."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import ApiKey, ApiToken
from accounts.roles import is_admin
from core.secrets import Issued, digest_secret, issue_secret

# last_used_at is a hint for operators; refreshing it at most once a minute keeps every
# authenticated request from turning into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def issue_api_token(user: Any, name: str) -> Issued:
    """Create an operator API token for ``user``."""
    secret = issue_secret("tok")
    token = ApiToken.objects.create(user=user, name=name, prefix=secret.prefix, digest=secret.digest)
    return Issued(record=token, plaintext=secret.plaintext)


def authenticate_api_token(plaintext: str) -> ApiToken | None:
    """The live token with this secret whose user is active, else ``None``."""
    token = (
        ApiToken.objects.select_related("user")
        .filter(digest=digest_secret(plaintext), revoked=False, user__is_active=True)
        .first()
    )
    if token is not None:
        _touch(ApiToken.objects.filter(pk=token.pk), token.last_used_at)
    return token


def create_api_key(
    owner: Any,
    name: str,
    requests_per_minute: int | None = None,
    tokens_per_day: int | None = None,
) -> Issued:
    """Create an end-user API key; unspecified quotas take the configured defaults."""
    secret = issue_secret("sk")
    key = ApiKey.objects.create(
        owner=owner,
        name=name,
        prefix=secret.prefix,
        digest=secret.digest,
        requests_per_minute=requests_per_minute or settings.API_KEY_DEFAULT_REQUESTS_PER_MINUTE,
        tokens_per_day=tokens_per_day or settings.API_KEY_DEFAULT_TOKENS_PER_DAY,
    )
    return Issued(record=key, plaintext=secret.plaintext)


PLAYGROUND_KEY_NAME = "playground"


def live_api_keys(owner: Any) -> int:
    """The owner's unrevoked keys (the chat playground's included)."""
    return ApiKey.objects.filter(owner=owner, revoked=False).count()


def authenticate_api_key(plaintext: str) -> ApiKey | None:
    """The unrevoked key with this secret whose owner is active, else ``None`` (chat gateway)."""
    key = (
        ApiKey.objects.select_related("owner")
        .filter(digest=digest_secret(plaintext), revoked=False, owner__is_active=True)
        .first()
    )
    if key is not None:
        _touch(ApiKey.objects.filter(pk=key.pk), key.last_used_at)
    return key


def revoke_api_key(key: ApiKey) -> ApiKey:
    """Mark the key revoked (idempotent); it stops authenticating immediately."""
    ApiKey.objects.filter(pk=key.pk).update(revoked=True)
    key.refresh_from_db()
    return key


def api_keys_visible_to(user: Any) -> QuerySet[ApiKey]:
    """Admins see every key; anyone else only their own."""
    keys = ApiKey.objects.select_related("owner").order_by("id")
    return keys if is_admin(user) else keys.filter(owner=user)


def _touch(queryset: QuerySet[Any], last_used_at: Any) -> None:
    now = timezone.now()
    if last_used_at is None or now - last_used_at >= LAST_USED_RESOLUTION:
        queryset.update(last_used_at=now)
