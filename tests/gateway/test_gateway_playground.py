"""The playground page and its session-authenticated key endpoint."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from accounts.models import ApiKey, Role, User
from accounts.services import (
    ApiKeyLimitReached,
    authenticate_api_key,
    create_api_key,
    create_api_key_within_limit,
    revoke_api_key,
)
from django.db import connection
from django.test import Client, override_settings
from rest_framework.test import APIClient

from tests.control_plane.key_races import count_live_keys_in_lockstep


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user(username="bob", password="bob-pw-8s2m", role=Role.VIEWER)


def test_the_page_needs_a_login_and_loads_the_streaming_script(bob: User) -> None:
    anonymous = Client().get("/playground/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    client = Client()
    client.force_login(bob)
    page = client.get("/playground/")
    assert page.status_code == 200
    assert b"gateway/playground.js" in page.content and b'data-key-url="/playground/key/"' in page.content


def test_the_key_endpoint_issues_one_key_per_session_and_replaces_a_revoked_one(bob: User) -> None:
    assert Client().post("/playground/key/").status_code == 401
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    assert client.post("/playground/key/").status_code == 403, "CSRF token required"
    client.get("/playground/")  # sets the CSRF cookie
    csrf = client.cookies["csrftoken"].value
    first = client.post("/playground/key/", HTTP_X_CSRFTOKEN=csrf).json()["key"]
    key = authenticate_api_key(first)
    assert key is not None and key.owner == bob and key.name == "playground"
    assert client.post("/playground/key/", HTTP_X_CSRFTOKEN=csrf).json()["key"] == first
    revoke_api_key(key)
    second = client.post("/playground/key/", HTTP_X_CSRFTOKEN=csrf).json()["key"]
    assert second != first and authenticate_api_key(second) is not None
    assert ApiKey.objects.filter(owner=bob).count() == 2


def test_another_user_gets_their_own_key(bob: User) -> None:
    carol = User.objects.create_user(username="carol", password="carol-pw-3j1q", role=Role.VIEWER)
    keys = []
    for user in (bob, carol):
        client = Client()
        client.force_login(user)
        keys.append(authenticate_api_key(client.post("/playground/key/").json()["key"]))
    assert [k.owner.username for k in keys if k is not None] == ["bob", "carol"]


def test_signing_in_again_does_not_pile_up_playground_keys(bob: User) -> None:
    secrets = []
    for _ in range(5):  # five sessions, each with a fresh key
        client = Client()
        client.force_login(bob)
        secrets.append(client.post("/playground/key/").json()["key"])
    live = [s for s in secrets if authenticate_api_key(s) is not None]
    assert live == secrets[-3:]  # the newest three stay usable
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 3


def fill_keys(user: User, count: int) -> list[ApiKey]:
    """``count`` live keys of the user's own (not the playground's)."""
    return [create_api_key(user, f"own-{i}").record for i in range(count)]


def playground_key(user: User) -> Any:
    """A fresh session's answer from the key endpoint."""
    client = Client()
    client.force_login(user)
    return client.post("/playground/key/")


@override_settings(API_KEYS_PER_USER=10)
def test_at_the_limit_a_new_playground_key_replaces_the_oldest_playground_key(bob: User) -> None:
    fill_keys(bob, 8)
    first, second = (playground_key(bob).json()["key"] for _ in range(2))
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 10

    third = playground_key(bob)
    assert third.status_code == 200
    assert authenticate_api_key(first) is None, "the oldest playground key makes room"
    assert authenticate_api_key(second) is not None and authenticate_api_key(third.json()["key"]) is not None
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 10
    assert ApiKey.objects.filter(owner=bob, revoked=False, name="playground").count() == 2
    with pytest.raises(ApiKeyLimitReached):  # the API still refuses an 11th: the playground's keys count
        create_api_key_within_limit(bob, "one-more")


@override_settings(API_KEYS_PER_USER=10)
def test_with_the_limit_full_of_the_users_own_keys_it_answers_409_and_issues_nothing(bob: User) -> None:
    own = fill_keys(bob, 10)
    response = playground_key(bob)
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert "you have 10 live API keys" in detail and "the API keys page (/api-keys/)" in detail
    assert "to use the playground" in detail
    assert ApiKey.objects.filter(owner=bob).count() == 10
    assert all(not key.revoked for key in ApiKey.objects.filter(pk__in=[k.pk for k in own]))

    revoke_api_key(own[0])
    assert playground_key(bob).status_code == 200
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 10


@override_settings(API_KEYS_PER_USER=10)
def test_the_limit_is_per_user(bob: User) -> None:
    carol = User.objects.create_user(username="carol", password="carol-pw-3j1q", role=Role.VIEWER)
    fill_keys(carol, 10)
    assert playground_key(carol).status_code == 409
    assert playground_key(bob).status_code == 200
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path")
@override_settings(API_KEYS_PER_USER=10)
def test_concurrent_issuers_cannot_pass_the_limit_together(
    bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot left; a playground session and an API request take it at once. Each waits (up to
    1 s) after counting the live keys for the other to have counted too: without a lock both see
    a free slot and the user ends up with 11 live keys."""

    fill_keys(bob, 9)
    count_live_keys_in_lockstep(monkeypatch)
    outcomes: list[str] = []
    api = APIClient()
    api.force_authenticate(bob)
    browser = Client()
    browser.force_login(bob)

    def from_the_playground() -> None:
        try:
            outcomes.append(f"playground {browser.post('/playground/key/').status_code}")
        finally:
            connection.close()

    def from_the_api() -> None:
        try:
            outcomes.append(f"api {api.post('/api/v1/api-keys/', {'name': 'ci'}, format='json').status_code}")
        finally:
            connection.close()

    threads = [threading.Thread(target=from_the_playground), threading.Thread(target=from_the_api)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) in (["api 201", "playground 409"], ["api 400", "playground 200"])
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 10
