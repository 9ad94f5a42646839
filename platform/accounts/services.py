"""Issuing, checking and revoking operator API tokens and end-user API keys."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import ApiKey, ApiToken
from accounts.roles import is_admin
from core.secrets import Issued, digest_secret, issue_secret

log = logging.getLogger(__name__)

# last_used_at tells operators when a credential was last used (and starts a token's idle
# lifetime); refreshing it at most once a minute keeps every authenticated request from turning
# into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class OwnerGone(PermissionDenied):
    """The user to issue a credential to was deleted meanwhile; nothing was issued."""


def lock_owner(owner: Any) -> None:
    """Lock the owner's row FOR NO KEY UPDATE until the caller's transaction ends, before it touches
    the owner's tokens or keys: the order a user's delete takes them in (``User.delete``). Rows that
    only reference the user (its jobs, its usage) are still written meanwhile.

    Raises:
        OwnerGone: the user was deleted (perhaps while this waited for the lock).
    """
    if not list(
        get_user_model().objects.select_for_update(no_key=True).filter(pk=owner.pk).values_list("pk")
    ):
        raise OwnerGone(f"user {owner.pk} no longer exists")


@transaction.atomic
def issue_api_token(user: Any, name: str) -> Issued:
    """Create an operator API token for ``user``.

    The user's expired tokens are deleted, and so are their least recently used live tokens beyond
    API_TOKENS_PER_USER (a script that signs in on every run keeps only its latest tokens).

    Raises:
        OwnerGone: the user was deleted meanwhile; nothing was issued.
    """
    lock_owner(user)  # concurrent sign-ins of one user then retire each other's tokens in turn
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
    if deleted:
        log.info("Deleted %d expired operator API token(s).", deleted)
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
    """Create an end-user API key; unspecified quotas take the configured defaults.

    No limit on the owner's live keys: requests go through ``create_api_key_within_limit`` (the API)
    or ``issue_playground_key`` (the playground), which hold API_KEYS_PER_USER.
    """
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
# One playground key per session would let a user multiply the per-key quotas by signing in again;
# the newest few stay (a user may have the playground open in more than one browser).
PLAYGROUND_KEYS_KEPT = 3


class ApiKeyLimitReached(Exception):
    """The owner holds ``live`` live API keys, and ``limit`` (API_KEYS_PER_USER) is the most allowed."""

    def __init__(self, live: int, limit: int) -> None:
        super().__init__(f"{live} live API keys, the most a user may hold ({limit})")
        self.live = live
        self.limit = limit

    @property
    def advice(self) -> str:
        """What a user creating a key is told (the API's 400, the dashboard's form error)."""
        return f"You have {self}; revoke one first."


@transaction.atomic
def create_api_key_within_limit(
    owner: Any,
    name: str,
    requests_per_minute: int | None = None,
    tokens_per_day: int | None = None,
) -> Issued:
    """``create_api_key``, unless the owner already holds API_KEYS_PER_USER live keys.

    Raises:
        ApiKeyLimitReached: nothing was created.
        OwnerGone: the owner was deleted meanwhile; nothing was created.
    """
    _make_room_for_a_key(owner, replaceable=ApiKey.objects.none())
    return create_api_key(owner, name, requests_per_minute, tokens_per_day)


@transaction.atomic
def issue_playground_key(owner: Any) -> Issued:
    """A new key named PLAYGROUND_KEY_NAME for the chat playground.

    The playground's keys count towards API_KEYS_PER_USER: at the limit, the owner's oldest live
    playground keys are revoked to make room (the new one replaces them). Beyond that only the
    newest PLAYGROUND_KEYS_KEPT playground keys stay live.

    Raises:
        ApiKeyLimitReached: the owner's other keys fill the limit; nothing was issued or revoked.
        OwnerGone: the owner was deleted meanwhile; nothing was issued.
    """
    playground = ApiKey.objects.filter(owner=owner, name=PLAYGROUND_KEY_NAME, revoked=False)
    _make_room_for_a_key(owner, replaceable=playground.order_by("created_at", "pk"))
    issued = create_api_key(owner, PLAYGROUND_KEY_NAME)
    stale = playground.order_by("-created_at", "-pk").values_list("pk", flat=True)[PLAYGROUND_KEYS_KEPT:]
    ApiKey.objects.filter(pk__in=list(stale)).update(revoked=True)
    return issued


def _make_room_for_a_key(owner: Any, replaceable: QuerySet[ApiKey]) -> None:
    """Check that the owner may hold one more live key, revoking the first of ``replaceable`` (the
    owner's live keys, in the order to give them up) as far as that takes; inside the caller's
    transaction, which is to create the key.

    The owner's row is locked until that transaction ends (``lock_owner``), so concurrent issuers
    for one owner (two browsers opening the playground, a script creating keys in parallel) count
    one after another and cannot together pass the limit.

    Raises:
        ApiKeyLimitReached: revoking every ``replaceable`` key would not make room; none was revoked.
        OwnerGone: the owner was deleted meanwhile.
    """
    lock_owner(owner)
    limit = settings.API_KEYS_PER_USER
    live = live_api_keys(owner)
    excess = live + 1 - limit
    if excess <= 0:
        return
    retired = list(replaceable.values_list("pk", flat=True)[:excess])
    if len(retired) < excess:
        raise ApiKeyLimitReached(live, limit)
    ApiKey.objects.filter(pk__in=retired).update(revoked=True)


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
    """Mark the key revoked (idempotent); it stops authenticating immediately.

    Raises:
        ApiKey.DoesNotExist: the key was deleted meanwhile (with its owner).
    """
    if not ApiKey.objects.filter(pk=key.pk).update(revoked=True):
        raise ApiKey.DoesNotExist(f"API key {key.pk} no longer exists")
    key.refresh_from_db()
    return key


def update_api_key(key: ApiKey, changes: dict[str, Any]) -> ApiKey:
    """Write ``changes`` (name, quotas) to the key, and only them: a revoke or a use recorded since
    ``key`` was read is kept.

    Raises:
        ApiKey.DoesNotExist: the key was deleted meanwhile (with its owner); nothing was written.
    """
    if changes and not ApiKey.objects.filter(pk=key.pk).update(**changes):
        raise ApiKey.DoesNotExist(f"API key {key.pk} no longer exists")
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
