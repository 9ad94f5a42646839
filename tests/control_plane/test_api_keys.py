"""End-user API keys: shown once, stored hashed, owned; outsiders get 404, quotas are admin-only."""

from __future__ import annotations

import hashlib
import threading

import pytest
from accounts.models import ApiKey, User
from accounts.services import authenticate_api_key
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from tests.control_plane.key_races import count_live_keys_in_lockstep

URL = "/api/v1/api-keys/"
pytestmark = pytest.mark.django_db


def test_it_shows_the_secret_once_and_stores_only_its_digest(viewer_client: APIClient, bob: User) -> None:
    created = viewer_client.post(URL, {"name": "laptop"}, format="json")
    assert created.status_code == 201, created.data
    secret = created.data["secret"]
    key = ApiKey.objects.get(pk=created.data["id"])
    assert key.owner == bob
    assert key.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {key.digest, key.prefix, key.name}
    assert secret.startswith(key.prefix)

    listed = viewer_client.get(URL)
    assert [row["id"] for row in listed.data["results"]] == [key.pk]
    assert "secret" not in listed.data["results"][0]
    assert "secret" not in viewer_client.get(f"{URL}{key.pk}/").data
    assert authenticate_api_key(secret) == key


def test_it_hides_keys_from_outsiders(
    viewer_client: APIClient, outsider_client: APIClient, admin_client: APIClient
) -> None:
    key_id = viewer_client.post(URL, {"name": "bob's"}, format="json").data["id"]

    assert outsider_client.get(f"{URL}{key_id}/").status_code == 404
    assert outsider_client.post(f"{URL}{key_id}/revoke/").status_code == 404
    assert outsider_client.patch(f"{URL}{key_id}/", {"name": "mine"}, format="json").status_code == 404
    assert outsider_client.get(URL).data["results"] == []
    key = ApiKey.objects.get(pk=key_id)
    assert (key.name, key.revoked) == ("bob's", False)

    # Admins see (and may revoke) every key.
    assert [row["id"] for row in admin_client.get(URL).data["results"]] == [key_id]


def test_it_revokes_a_key(viewer_client: APIClient) -> None:
    created = viewer_client.post(URL, {"name": "ci"}, format="json").data
    response = viewer_client.post(f"{URL}{created['id']}/revoke/")
    assert response.status_code == 200
    assert response.data["revoked"] is True
    assert ApiKey.objects.get(pk=created["id"]).revoked
    assert authenticate_api_key(created["secret"]) is None


def test_it_lets_only_admins_set_quotas(viewer_client: APIClient, admin_client: APIClient, bob: User) -> None:
    denied = viewer_client.post(URL, {"name": "big", "requests_per_minute": 10_000}, format="json")
    assert denied.status_code == 400
    assert "requests_per_minute" in denied.data
    assert ApiKey.objects.count() == 0

    key_id = viewer_client.post(URL, {"name": "std"}, format="json").data["id"]
    assert viewer_client.patch(f"{URL}{key_id}/", {"tokens_per_day": 1}, format="json").status_code == 400
    granted = admin_client.patch(f"{URL}{key_id}/", {"requests_per_minute": 600}, format="json")
    assert granted.status_code == 200
    key = ApiKey.objects.get(pk=key_id)
    assert key.requests_per_minute == 600
    assert key.owner == bob


def test_the_playgrounds_key_name_is_reserved(viewer_client: APIClient, admin_client: APIClient) -> None:
    # The playground replaces the oldest key of this name at the key limit: a key of the user's own
    # named so would be revoked without a word.
    for name in ("playground", " playground "):
        refused = viewer_client.post(URL, {"name": name}, format="json")
        assert refused.status_code == 400 and "reserved" in refused.data["name"][0]
    assert ApiKey.objects.count() == 0
    key_id = viewer_client.post(URL, {"name": "ci"}, format="json").data["id"]
    renamed = viewer_client.patch(f"{URL}{key_id}/", {"name": "playground"}, format="json")
    assert renamed.status_code == 400 and "name" in renamed.data
    assert ApiKey.objects.get(pk=key_id).name == "ci"
    # A playground key itself may still be edited (an admin setting its quotas names it unchanged).
    ApiKey.objects.filter(pk=key_id).update(name="playground")
    kept = admin_client.patch(
        f"{URL}{key_id}/", {"name": "playground", "requests_per_minute": 5}, format="json"
    )
    assert kept.status_code == 200


def test_it_refuses_a_key_name_with_a_control_character(viewer_client: APIClient) -> None:
    """The rule of ApiKey.name, as of ApiToken.name: a newline forged lines where keys are listed
    or logged, an escape sequence drove the terminal."""
    message = "Control characters (newline, tab, escape, ...) are not allowed: {} at index 2."
    refused = viewer_client.post(URL, {"name": "ci\x1b[2Jbot"}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"name": [message.format("'\\x1b'")]}
    assert ApiKey.objects.count() == 0
    key_id = viewer_client.post(URL, {"name": "ci bot ü"}, format="json").data["id"]  # spaces, letters: fine
    renamed = viewer_client.patch(f"{URL}{key_id}/", {"name": "ci\nbot"}, format="json")
    assert renamed.status_code == 400
    assert renamed.json() == {"name": [message.format("'\\n'")]}
    assert ApiKey.objects.get(pk=key_id).name == "ci bot ü"


def test_it_rejects_unknown_and_read_only_fields(viewer_client: APIClient) -> None:
    response = viewer_client.post(URL, {"name": "x", "revoked": True, "scope": "all"}, format="json")
    assert response.status_code == 400
    assert set(response.data) == {"revoked", "scope"}
    assert ApiKey.objects.count() == 0


@override_settings(API_KEYS_PER_USER=3)
def test_a_user_holds_at_most_the_configured_number_of_live_keys(viewer_client: APIClient, bob: User) -> None:
    created = [viewer_client.post(URL, {"name": f"k{i}"}, format="json") for i in range(3)]
    assert [r.status_code for r in created] == [201, 201, 201]
    refused = viewer_client.post(URL, {"name": "k3"}, format="json")
    assert refused.status_code == 400
    assert "revoke one first" in refused.json()["non_field_errors"][0]
    assert ApiKey.objects.filter(owner=bob).count() == 3
    assert viewer_client.post(f"{URL}{created[0].data['id']}/revoke/").status_code == 200
    assert viewer_client.post(URL, {"name": "k3"}, format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path")
@override_settings(API_KEYS_PER_USER=3)
def test_concurrent_creations_cannot_pass_the_limit_together(
    bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot left, two requests for it at once. Each waits (up to 1 s) after counting the live
    keys for the other to have counted too: without a lock both see the free slot."""
    from accounts import services

    for i in range(2):
        services.create_api_key(bob, f"k{i}")
    count_live_keys_in_lockstep(monkeypatch)
    statuses: list[int] = []

    def create(name: str) -> None:
        client = APIClient()
        client.force_authenticate(bob)
        try:
            statuses.append(client.post(URL, {"name": name}, format="json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(statuses) == [201, 400]
    assert ApiKey.objects.filter(owner=bob, revoked=False).count() == 3
