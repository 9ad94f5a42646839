"""Issuing, checking and revoking operator API tokens and end-user API keys."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import ApiKey, ApiToken
from accounts.roles import is_admin
from core.secrets import Issued, digest_secret, issue_secret

# last_used_at tells operators when a credential was last used (and starts a token's idle
# lifetime); refreshing it at most once a minute keeps every authenticated request from turning
# into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@transaction.atomic
def issue_api_token(user: Any, name: str) -> Issued:
    """Create an operator API token for ``user``.

    The user's expired tokens are deleted, and so are their least recently used live tokens beyond
    API_TOKENS_PER_USER (a script that signs in on every run keeps only its latest tokens).
    """
    now = timezone.now()
    _tokens_with_last_seen().filter(_expired(now), user=user).delete()
    secret = issue_secret("tok")
    token = ApiToken.objects.create(user=user, name=name, prefix=secret.prefix, digest=secret.digest)
    live = ApiToken.objects.filter(user=user, revoked=False).order_by(_LAST_SEEN.desc(), "-id")
    retired = list(live.values_list("pk", flat=True)[settings.API_TOKENS_PER_USER :])
    ApiToken.objects.filter(pk__in=retired).delete()
    return Issued(record=token, plaintext=secret.plaintext)


def authenticate_api_token(plaintext: str) -> ApiToken | None:
    """The live (unrevoked, unexpired) token with this secret whose user is active, else ``None``."""
    token = (
        _tokens_with_last_seen()
        .select_related("user")
        .filter(digest=digest_secret(plaintext), revoked=False, user__is_active=True)
        .exclude(_expired(timezone.now()))
        .first()
    )
    if token is not None:
        _touch(ApiToken.objects.filter(pk=token.pk), token.last_used_at)
    return token


def prune_expired_api_tokens() -> int:
    """Delete every expired token (Celery beat runs this); returns how many went."""
    deleted, _ = ApiToken.objects.filter(
        pk__in=_tokens_with_last_seen().filter(_expired(timezone.now())).values("pk")
    ).delete()
    return deleted


# last_used_at is refreshed at most once per LAST_USED_RESOLUTION, so an idle lifetime measured from
# it is late by under a minute; a never-used token is idle since it was issued.
_LAST_SEEN = Coalesce("last_used_at", "created_at")


def _tokens_with_last_seen() -> QuerySet[ApiToken]:
    return ApiToken.objects.alias(last_seen=_LAST_SEEN)


def _expired(now: datetime) -> Q:
    """Tokens idle for API_TOKEN_IDLE_DAYS or issued over API_TOKEN_MAX_AGE_DAYS ago (needs
    ``_tokens_with_last_seen``)."""
    idle_since = now - timedelta(days=settings.API_TOKEN_IDLE_DAYS)
    issued_before = now - timedelta(days=settings.API_TOKEN_MAX_AGE_DAYS)
    return Q(last_seen__lt=idle_since) | Q(created_at__lt=issued_before)


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
