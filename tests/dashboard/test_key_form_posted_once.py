"""The dashboard's New key form creates at most one key: posting it again (a reload of the answer
that showed the secret, a double click) creates none and leads back to the list, which says what
the form created; a form the session did not issue creates nothing; a form refused (the key limit)
may be posted again; each rendering of the page is a form of its own."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from accounts.models import ApiKey, User
from accounts.services import create_api_key, revoke_api_key
from dashboard.keys import FORM_EXPIRED
from django.db import connection
from django.test import Client

from tests.control_plane.key_races import count_live_keys_in_lockstep
from tests.dashboard.test_dashboard_api_keys import NEW, PAGE, _secret, issued_form
from tests.dashboard.test_dashboard_form_errors import field_errors

pytestmark = pytest.mark.django_db


def test_the_same_form_posted_twice_creates_one_key(viewer_client: Client, viewer_user: User) -> None:
    form = {"form": issued_form(viewer_client), "name": "notebook"}
    first = viewer_client.post(NEW, form)
    assert first.status_code == 201
    secret = _secret(first)
    key = ApiKey.objects.get(owner=viewer_user)

    again = viewer_client.post(NEW, form)  # the browser's reload of the answer above
    assert again.status_code == 303 and again["Location"] == PAGE
    assert ApiKey.objects.count() == 1
    page = viewer_client.get(PAGE).content.decode()
    assert (
        f'id="notice">This form was already submitted and created notebook ({key.prefix}…), whose '
        "secret was shown only then; no second key was created.</p>"
    ) in page
    assert secret not in page and "new-secret" not in page
    assert viewer_client.post(NEW, form).status_code == 303  # and so on
    assert ApiKey.objects.count() == 1


def test_each_rendering_of_the_page_creates_its_own_key(viewer_client: Client) -> None:
    tabs = [issued_form(viewer_client), issued_form(viewer_client)]
    assert tabs[0] != tabs[1]
    for n, form in enumerate(tabs):
        assert viewer_client.post(NEW, {"form": form, "name": f"tab-{n}"}).status_code == 201
    assert sorted(ApiKey.objects.values_list("name", flat=True)) == ["tab-0", "tab-1"]


@pytest.mark.parametrize("form", [None, "", "made-up", "another-session"])
def test_a_form_the_session_did_not_issue_creates_nothing(
    viewer_client: Client, viewer_user: User, form: str | None
) -> None:
    if form == "another-session":
        other = Client()
        other.force_login(viewer_user)
        form = issued_form(other)
    response = viewer_client.post(
        NEW, {"name": "notebook"} if form is None else {"form": form, "name": "notebook"}
    )
    assert response.status_code == 400
    assert field_errors(response) == {"non_field_errors": [FORM_EXPIRED]}
    assert not ApiKey.objects.exists()
    page = response.content.decode()
    assert 'value="notebook"' in page  # kept, in a fresh form that creates the key
    fresh = {"form": issued_form(viewer_client), "name": "notebook"}
    assert viewer_client.post(NEW, fresh).status_code == 201


def test_a_form_refused_at_the_key_limit_may_be_posted_again(
    viewer_client: Client, viewer_user: User, settings: Any
) -> None:
    settings.API_KEYS_PER_USER = 1
    old = create_api_key(viewer_user, "old").record
    form = {"form": issued_form(viewer_client), "name": "new"}
    assert viewer_client.post(NEW, form).status_code == 400
    revoke_api_key(old)
    assert viewer_client.post(NEW, form).status_code == 201
    assert ApiKey.objects.filter(name="new").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path")
def test_a_double_click_creates_one_key(viewer_user: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both posts of the form are in flight at once; each one that counts the user's keys waits for
    the other to count too (up to 1 s): without the user's lock ordering them, both create a key."""
    count_live_keys_in_lockstep(monkeypatch)
    first = Client()
    first.force_login(viewer_user)
    form = {"form": issued_form(first), "name": "notebook"}
    second = Client()
    second.cookies = first.cookies  # the same browser
    statuses: list[int] = []

    def post(client: Client) -> None:
        try:
            statuses.append(client.post(NEW, form).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(client,)) for client in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(statuses) == [201, 303]
    assert ApiKey.objects.count() == 1
