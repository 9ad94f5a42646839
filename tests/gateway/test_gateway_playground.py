"""The playground page and its session-authenticated key endpoint."""

from __future__ import annotations

import pytest
from accounts.models import ApiKey, Role, User
from accounts.services import authenticate_api_key, revoke_api_key
from django.test import Client


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
