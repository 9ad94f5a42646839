"""Authentication and roles: anonymous 401, viewers read-only, tokens, sessions, public endpoints."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import ApiToken, User
from accounts.services import issue_api_token
from jobs.models import Job
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

PROTECTED = [
    "/api/v1/models/",
    "/api/v1/hosts/",
    "/api/v1/devices/",
    "/api/v1/deployments/",
    "/api/v1/jobs/",
    "/api/v1/api-keys/",
    "/api/v1/auth/me/",
]


@pytest.mark.parametrize("url", PROTECTED)
def test_it_answers_anonymous_requests_with_401(anon_client: APIClient, url: str) -> None:
    response = anon_client.get(url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_it_rejects_anonymous_writes_with_401_and_stores_nothing(
    anon_client: APIClient, model_payload: dict[str, Any]
) -> None:
    assert anon_client.post("/api/v1/models/", model_payload, format="json").status_code == 401
    assert ServedModel.objects.count() == 0


@pytest.mark.parametrize("url", PROTECTED)
def test_it_lets_viewers_read(viewer_client: APIClient, url: str) -> None:
    assert viewer_client.get(url).status_code == 200


def test_it_forbids_viewer_writes(
    viewer_client: APIClient, admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    assert viewer_client.post("/api/v1/models/", model_payload, format="json").status_code == 403
    assert ServedModel.objects.count() == 0

    model_id = admin_client.post("/api/v1/models/", model_payload, format="json").data["id"]
    patch = viewer_client.patch(f"/api/v1/models/{model_id}/", {"slo_ttft_p99_ms": 1}, format="json")
    assert patch.status_code == 403
    assert viewer_client.delete(f"/api/v1/models/{model_id}/").status_code == 403
    model = ServedModel.objects.get(pk=model_id)
    assert model.slo_ttft_p99_ms == 500.0

    job = viewer_client.post("/api/v1/jobs/", {"kind": "noop"}, format="json")
    assert job.status_code == 403
    assert Job.objects.count() == 0


def test_it_rejects_bad_revoked_and_inactive_tokens(bob: User) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token tok_not-a-real-token")
    assert client.get("/api/v1/models/").status_code == 401

    issued = issue_api_token(bob, "t")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.plaintext}")
    assert client.get("/api/v1/models/").status_code == 200
    ApiToken.objects.filter(pk=issued.record.pk).update(revoked=True)
    assert client.get("/api/v1/models/").status_code == 401

    other = issue_api_token(bob, "t2")
    bob.is_active = False
    bob.save()
    client.credentials(HTTP_AUTHORIZATION=f"Token {other.plaintext}")
    assert client.get("/api/v1/models/").status_code == 401


def test_it_issues_a_token_for_valid_credentials_only(anon_client: APIClient, alice: User) -> None:
    wrong = anon_client.post("/api/v1/auth/token/", {"username": "alice", "password": "nope"}, format="json")
    assert wrong.status_code == 400
    assert ApiToken.objects.count() == 0

    ok = anon_client.post(
        "/api/v1/auth/token/", {"username": "alice", "password": "alice-pw-9f2k"}, format="json"
    )
    assert ok.status_code == 201
    assert ok.data["role"] == "admin"
    token = ApiToken.objects.get()
    assert token.digest != ok.data["token"] and ok.data["token"] not in token.digest  # stored hashed

    anon_client.credentials(HTTP_AUTHORIZATION=f"Token {ok.data['token']}")
    me = anon_client.get("/api/v1/auth/me/")
    assert me.status_code == 200
    assert me.data == {"username": "alice", "role": "admin"}


@pytest.mark.parametrize("extra", [{"extra": 1}, {"nmae": "ci"}, {"name": "ci", "role": "admin"}])
def test_it_refuses_unknown_fields_in_a_token_request(
    anon_client: APIClient, alice: User, extra: dict[str, Any]
) -> None:
    credentials = {"username": "alice", "password": "alice-pw-9f2k"}
    response = anon_client.post("/api/v1/auth/token/", {**credentials, **extra}, format="json")
    assert response.status_code == 400
    assert response.json() == {key: ["Unknown field."] for key in extra if key != "name"}
    assert not ApiToken.objects.exists()

    named = anon_client.post("/api/v1/auth/token/", {**credentials, "name": "ci"}, format="json")
    assert named.status_code == 201
    assert ApiToken.objects.get().name == "ci"


def test_it_refuses_a_token_name_with_a_control_character(anon_client: APIClient, alice: User) -> None:
    """The rule of ApiToken.name, which issue_api_token applies too (a newline forged lines)."""
    credentials = {"username": "alice", "password": "alice-pw-9f2k"}
    response = anon_client.post("/api/v1/auth/token/", {**credentials, "name": "ci\x1b[2Jbot"}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "name": ["Control characters (newline, tab, escape, ...) are not allowed: '\\x1b' at index 2."]
    }
    assert not ApiToken.objects.exists()


def test_signing_in_without_next_lands_on_the_dashboard(client: Any, bob: User) -> None:
    login = client.post("/accounts/login/", {"username": "bob", "password": "bob-pw-9f2k"})
    assert login.status_code == 302
    assert login["Location"] == "/"
    assert client.get(login["Location"]).status_code == 200
    again = client.post("/accounts/login/", {"username": "bob", "password": "bob-pw-9f2k", "next": "/jobs/"})
    assert again["Location"] == "/jobs/"


def test_it_accepts_session_login(client: Any, bob: User) -> None:
    login = client.post("/accounts/login/", {"username": "bob", "password": "bob-pw-9f2k"})
    assert login.status_code == 302
    assert client.get("/api/v1/models/").status_code == 200
    assert client.get("/accounts/login/").status_code == 200


def test_it_serves_health_without_auth_and_schema_and_docs_to_users_only(
    anon_client: APIClient, viewer_client: APIClient
) -> None:
    health = anon_client.get("/api/health/")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "database": "ok"}
    for url in ("/api/schema/", "/api/docs/"):
        assert anon_client.get(url).status_code == 401
    # A browser signed out is told so and sent to sign in, and back (was DRF's bare 401 page).
    signed_out = anon_client.get("/api/docs/?x=1", HTTP_ACCEPT="text/html")
    assert (signed_out.status_code, signed_out["WWW-Authenticate"]) == (401, "Token")
    assert b'<a id="sign-in" href="/accounts/login/?next=%2Fapi%2Fdocs%2F%3Fx%3D1">' in signed_out.content
    schema = viewer_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/v1/models/", "/api/v1/jobs/{id}/cancel/", "/api/v1/api-keys/"} <= set(paths)
    docs = viewer_client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content
