"""Users of any role manage their own API keys on the dashboard's "API keys" page, under the REST
API's rules: they see and revoke only their own keys (admins: everyone's, as in the API), a new
key's secret is shown once and works for /v1, bad input and the key limit are field errors with
nothing created, and a viewer may not set quotas."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from accounts.models import ApiKey, Role, User
from accounts.services import authenticate_api_key, create_api_key, revoke_api_key
from agents.models import Replica
from deployments.models import Deployment, ObservedState
from django.test import Client
from django.utils import timezone
from gateway.services import admit
from inventory.services import mark_seen, register_host
from registry.models import ServedModel
from rest_framework.test import APIClient

from core.secrets import digest_secret
from tests.dashboard.conftest import make_user
from tests.dashboard.test_dashboard_form_errors import field_errors

pytestmark = pytest.mark.django_db

PAGE = "/api-keys/"
NEW = "/api-keys/new/"


@pytest.fixture
def other_user(db: None) -> User:
    return make_user("charlie", Role.VIEWER)


def issued_form(client: Client) -> str:
    """The one-time value of the New key form on the page the client loads now."""
    found = re.search(r'<input type="hidden" name="form" value="([^"]+)">', client.get(PAGE).content.decode())
    assert found, "no form value on the page"
    return found.group(1)


def post_form(client: Client, fields: dict[str, str]) -> Any:
    """What a browser posts: the form of a freshly loaded page, filled in with ``fields``."""
    return client.post(NEW, {"form": issued_form(client), **fields})


def _secret(response: Any) -> str:
    found = re.search(r'<code id="new-secret">([^<]+)</code>', response.content.decode())
    assert found, "no secret on the page"
    return html.unescape(found.group(1))


def test_the_page_lists_only_the_viewers_own_keys(
    viewer_client: Client, viewer_user: User, other_user: User
) -> None:
    mine = create_api_key(viewer_user, "bobs-laptop").record
    theirs = create_api_key(other_user, "charlies-private-key").record
    revoke_api_key(create_api_key(viewer_user, "bobs-old").record)

    response = viewer_client.get(PAGE)
    page = response.content.decode()
    assert response.status_code == 200
    assert "bobs-laptop" in page and f"{mine.prefix}…" in page and "bobs-old" in page
    assert theirs.name not in page and theirs.prefix not in page
    assert f'id="revoke-key-{mine.pk}"' in page and "never" in page  # live, never used
    assert 'data-revoked="true"' in page  # the revoked one is listed as such, without a button
    assert f'href="{PAGE}">API keys</a>' in viewer_client.get("/").content.decode()  # in the navigation


def test_an_admin_sees_every_users_keys_as_in_the_api(
    admin_client: Client, admin_user: User, other_user: User
) -> None:
    theirs = create_api_key(other_user, "charlies-private-key").record
    page = admin_client.get(PAGE).content.decode()
    api = APIClient()
    api.force_authenticate(admin_user)
    assert [k["name"] for k in api.get("/api/v1/api-keys/").json()["results"]] == [theirs.name]
    assert theirs.name in page and "<td>charlie</td>" in page
    assert admin_client.post(f"/api-keys/{theirs.pk}/revoke/").status_code == 302  # as the API lets them
    theirs.refresh_from_db()
    assert theirs.revoked


def test_a_viewer_creates_a_key_whose_secret_is_shown_once_and_works_for_v1(
    viewer_client: Client, viewer_user: User, settings: Any
) -> None:
    response = post_form(viewer_client, {"name": "notebook", "requests_per_minute": "", "tokens_per_day": ""})
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    secret = _secret(response)
    key = ApiKey.objects.get(owner=viewer_user)
    assert (key.name, key.digest, key.revoked) == ("notebook", digest_secret(secret), False)
    assert key.requests_per_minute == settings.API_KEY_DEFAULT_REQUESTS_PER_MINUTE
    assert key.tokens_per_day == settings.API_KEY_DEFAULT_TOKENS_PER_DAY

    # Never again: not on the page, not kept in the session.
    assert secret not in viewer_client.get(PAGE).content.decode()
    assert secret not in repr(dict(viewer_client.session.items()))

    # The key admits a request to a served model through the gateway.
    model = _served_model()
    authenticated = authenticate_api_key(secret)
    assert authenticated is not None and authenticated.pk == key.pk
    admission = admit(authenticated, model.name)
    assert admission.key_id == key.pk and admission.model_name == model.name


def test_an_admin_sets_quotas_on_a_new_key(admin_client: Client, admin_user: User) -> None:
    response = post_form(admin_client, {"name": "batch", "requests_per_minute": "5", "tokens_per_day": "700"})
    assert response.status_code == 201
    key = ApiKey.objects.get(owner=admin_user)
    assert (key.requests_per_minute, key.tokens_per_day) == (5, 700)


@pytest.mark.parametrize(
    ("role", "form"),
    [
        (Role.VIEWER, {"name": ""}),
        (Role.VIEWER, {"name": "   "}),
        (Role.VIEWER, {"name": "x" * 101}),
        (Role.VIEWER, {"name": "playground"}),
        (Role.VIEWER, {"name": "ci\x1b[2Jbot"}),  # a control character: the model field's rule
        (Role.VIEWER, {"name": "mine", "requests_per_minute": "5"}),  # quotas: admins only
        (Role.ADMIN, {"name": "mine", "requests_per_minute": "0", "tokens_per_day": "lots"}),
        (Role.ADMIN, {"name": "", "tokens_per_day": str(2**63)}),
    ],
)
def test_bad_input_gets_the_apis_field_errors_and_creates_nothing(role: Role, form: dict[str, str]) -> None:
    user = make_user("dora", role)
    client = Client()
    client.force_login(user)
    response = post_form(client, form)
    assert response.status_code == 400
    errors = field_errors(response)

    api = APIClient()
    api.force_authenticate(user)
    expected = api.post("/api/v1/api-keys/", form, format="json")
    assert expected.status_code == 400
    assert errors == expected.json() and errors
    assert not ApiKey.objects.exists()
    page = response.content.decode()
    assert 'role="alert"' in page and "new-secret" not in page
    assert f'value="{html.escape(form["name"])}"' in page  # what was typed is kept


def test_the_reserved_name_says_why(viewer_client: Client) -> None:
    errors = field_errors(post_form(viewer_client, {"name": "playground"}))
    assert errors["name"] == [
        "'playground' is reserved for the chat playground's own keys; choose another name."
    ]


def test_at_the_key_limit_it_says_so_and_creates_nothing(
    viewer_client: Client, viewer_user: User, settings: Any
) -> None:
    settings.API_KEYS_PER_USER = 2
    for name in ("one", "two"):
        create_api_key(viewer_user, name)
    response = post_form(viewer_client, {"name": "three"})
    assert response.status_code == 400
    assert field_errors(response) == {
        "non_field_errors": ["You have 2 live API keys, the most a user may hold (2); revoke one first."]
    }
    assert not ApiKey.objects.filter(name="three").exists()


def test_a_viewer_revokes_their_own_key(viewer_client: Client, viewer_user: User) -> None:
    issued = create_api_key(viewer_user, "old-laptop")
    response = viewer_client.post(f"/api-keys/{issued.record.pk}/revoke/")
    assert response.status_code == 302 and response["Location"] == PAGE
    issued.record.refresh_from_db()
    assert issued.record.revoked
    assert authenticate_api_key(issued.plaintext) is None
    page = viewer_client.get(PAGE).content.decode()
    assert f'id="notice">Revoked old-laptop ({issued.record.prefix}…).</p>' in page
    assert f'id="revoke-key-{issued.record.pk}"' not in page


def test_another_users_key_cannot_be_revoked(viewer_client: Client, other_user: User) -> None:
    theirs = create_api_key(other_user, "charlies-private-key").record
    assert viewer_client.post(f"/api-keys/{theirs.pk}/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert not theirs.revoked


def test_anonymous_browsers_are_sent_to_sign_in_and_nothing_is_created(viewer_user: User) -> None:
    key = create_api_key(viewer_user, "bobs").record
    anonymous = Client()
    for response in (
        anonymous.get(PAGE),
        anonymous.post(NEW, {"name": "sneaky"}),
        anonymous.post(f"/api-keys/{key.pk}/revoke/"),
    ):
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")
    key.refresh_from_db()
    assert not key.revoked and ApiKey.objects.count() == 1


def test_writes_are_post_only_with_csrf_and_the_page_read_only(viewer_user: User) -> None:
    key = create_api_key(viewer_user, "bobs").record
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer_user)
    assert client.get(NEW).status_code == 405
    assert client.get(f"/api-keys/{key.pk}/revoke/").status_code == 405
    assert client.post(NEW, {"name": "no-token"}).status_code == 403  # no CSRF token
    assert client.post(f"/api-keys/{key.pk}/revoke/").status_code == 403
    key.refresh_from_db()
    assert not key.revoked and ApiKey.objects.count() == 1
    plain = Client()
    plain.force_login(viewer_user)
    assert plain.post(PAGE, {"name": "x"}).status_code == 405


def _served_model() -> ServedModel:
    """The model "tiny" with one running replica on an online host."""
    model = ServedModel.objects.create(
        name="tiny", source="/m", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    host = register_host("unit-host", "127.0.0.1")
    mark_seen(host)
    deployment = Deployment.objects.create(model=model, host=host, observed_state=ObservedState.RUNNING)
    Replica.objects.create(
        deployment=deployment, state="running", base_url="http://replica-a", reported_at=timezone.now()
    )
    return model
