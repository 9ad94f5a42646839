"""Operator API tokens expire (idle and absolute lifetimes), are pruned by beat, and are capped per user."""

from __future__ import annotations

from datetime import timedelta

import pytest
from accounts.models import ApiToken, User
from accounts.services import issue_api_token
from accounts.tasks import prune_api_tokens
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from inventory.models import AgentToken
from inventory.services import authenticate_agent, issue_agent_token, register_host
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return client


def _age(token: ApiToken, *, created_days: float, used_days: float | None) -> None:
    """Move the token's creation (and last use, ``None`` for never used) that many days back."""
    now = timezone.now()
    last_used = None if used_days is None else now - timedelta(days=used_days)
    ApiToken.objects.filter(pk=token.pk).update(
        created_at=now - timedelta(days=created_days), last_used_at=last_used
    )


@override_settings(API_TOKEN_IDLE_DAYS=30, API_TOKEN_MAX_AGE_DAYS=90)
def test_it_refuses_a_token_idle_longer_than_the_idle_lifetime(bob: User) -> None:
    idle = issue_api_token(bob, "idle")
    _age(idle.record, created_days=40, used_days=31)
    never_used = issue_api_token(bob, "never-used")
    _age(never_used.record, created_days=31, used_days=None)
    active = issue_api_token(bob, "active")
    _age(active.record, created_days=40, used_days=29)

    for expired in (idle, never_used):
        response = _client(expired.plaintext).get("/api/v1/auth/me/")
        assert response.status_code == 401
        assert "expired" in response.json()["detail"]
    assert _client(active.plaintext).get("/api/v1/auth/me/").status_code == 200
    active.record.refresh_from_db()
    assert active.record.last_used_at is not None
    assert timezone.now() - active.record.last_used_at < timedelta(minutes=1)  # use resets the idle clock


@override_settings(API_TOKEN_IDLE_DAYS=30, API_TOKEN_MAX_AGE_DAYS=90)
def test_it_refuses_a_token_older_than_the_absolute_lifetime_even_in_use(bob: User) -> None:
    old = issue_api_token(bob, "old")
    _age(old.record, created_days=91, used_days=0.01)
    assert _client(old.plaintext).get("/api/v1/auth/me/").status_code == 401
    younger = issue_api_token(bob, "younger")
    _age(younger.record, created_days=89, used_days=0.01)
    assert _client(younger.plaintext).get("/api/v1/auth/me/").status_code == 200


def test_it_uses_the_configured_lifetimes(bob: User) -> None:
    token = issue_api_token(bob, "t")
    _age(token.record, created_days=3, used_days=2)
    assert _client(token.plaintext).get("/api/v1/auth/me/").status_code == 200
    with override_settings(API_TOKEN_IDLE_DAYS=1):
        _age(token.record, created_days=3, used_days=2)
        assert _client(token.plaintext).get("/api/v1/auth/me/").status_code == 401
    with override_settings(API_TOKEN_MAX_AGE_DAYS=2):
        _age(token.record, created_days=3, used_days=0.01)
        assert _client(token.plaintext).get("/api/v1/auth/me/").status_code == 401


@override_settings(API_TOKENS_PER_USER=3)
def test_it_keeps_at_most_the_cap_of_live_tokens_per_user_deleting_the_oldest(
    anon_client: APIClient, bob: User, charlie: User
) -> None:
    other = issue_api_token(charlie, "charlie's")
    secrets = []
    for _ in range(5):
        response = anon_client.post(
            "/api/v1/auth/token/", {"username": "bob", "password": "bob-pw-9f2k"}, format="json"
        )
        assert response.status_code == 201
        secrets.append(response.data["token"])

    assert ApiToken.objects.filter(user=bob).count() == 3
    for retired in secrets[:2]:
        assert _client(retired).get("/api/v1/auth/me/").status_code == 401
    for kept in secrets[2:]:
        assert _client(kept).get("/api/v1/auth/me/").status_code == 200
    assert _client(other.plaintext).get("/api/v1/auth/me/").status_code == 200  # other users untouched


@override_settings(API_TOKENS_PER_USER=3)
def test_it_retires_the_least_recently_used_token_not_a_busy_old_one(bob: User) -> None:
    busy, idle, recent = (issue_api_token(bob, name) for name in ("busy", "idle", "recent"))
    _age(busy.record, created_days=3, used_days=0.01)
    _age(idle.record, created_days=2, used_days=None)
    _age(recent.record, created_days=1, used_days=None)

    issue_api_token(bob, "newest")

    assert set(ApiToken.objects.filter(user=bob).values_list("name", flat=True)) == {
        "busy",
        "recent",
        "newest",
    }


@override_settings(API_TOKEN_IDLE_DAYS=30, API_TOKEN_MAX_AGE_DAYS=90)
def test_the_beat_task_deletes_expired_tokens_only(bob: User, charlie: User) -> None:
    idle, live = issue_api_token(bob, "idle"), issue_api_token(bob, "live")
    old, fresh = issue_api_token(charlie, "old"), issue_api_token(charlie, "fresh")
    _age(idle.record, created_days=40, used_days=31)
    _age(live.record, created_days=40, used_days=1)
    _age(old.record, created_days=91, used_days=0.01)

    assert prune_api_tokens() == 2

    assert set(ApiToken.objects.values_list("pk", flat=True)) == {live.record.pk, fresh.record.pk}
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert prune_api_tokens.name in scheduled


def test_agent_tokens_do_not_expire(bob: User) -> None:
    host = register_host("gpu-1")
    agent = issue_agent_token(host)
    AgentToken.objects.filter(pk=agent.record.pk).update(created_at=timezone.now() - timedelta(days=3650))

    prune_api_tokens()

    assert authenticate_agent(agent.plaintext) == host
