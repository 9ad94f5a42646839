"""Credentials that must not outlive or escape their holder: operator API tokens end with a
password change, the admin cannot hand a token or key to another user or bring a revoked one back,
and there is no anonymous password reset mailing links."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import ApiKey, ApiToken, Role, User
from accounts.services import create_api_key, issue_api_token, revoke_api_key
from django.contrib.auth import authenticate
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Permission
from django.core import mail
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def _me(token: str) -> Any:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client.get("/api/v1/auth/me/")


def test_changing_the_password_ends_the_users_api_tokens_only(bob: User, charlie: User) -> None:
    mine = issue_api_token(bob, "script").plaintext
    theirs = issue_api_token(charlie, "script").plaintext
    key = create_api_key(bob, "chat").record
    client = Client()
    client.force_login(bob)
    new = "a-new-pass-7Qx!z"
    changed = client.post(
        "/accounts/password_change/",
        {"old_password": "bob-pw-9f2k", "new_password1": new, "new_password2": new},
    )
    assert changed.status_code == 302
    assert _me(mine).status_code == 401  # issued with the old password: gone with it
    assert not ApiToken.objects.filter(user=bob).exists()
    assert _me(theirs).status_code == 200  # another user's tokens stay
    assert ApiKey.objects.get(pk=key.pk).revoked is False  # end-user keys are managed on their own
    assert _me(issue_api_token(bob, "again").plaintext).status_code == 200  # new ones work


def test_saving_a_user_without_a_new_password_keeps_their_tokens(bob: User) -> None:
    token = issue_api_token(bob, "script").plaintext
    bob.first_name = "Bob"
    bob.save()
    assert _me(token).status_code == 200
    # Signing in with an outdated hash (here: a short salt) re-hashes the same password: that is no
    # password change.
    old = make_password("bob-pw-9f2k", salt="ab", hasher="md5")
    User.objects.filter(pk=bob.pk).update(password=old)
    assert authenticate(username="bob", password="bob-pw-9f2k") is not None
    assert User.objects.get(pk=bob.pk).password != old  # re-hashed ...
    assert _me(token).status_code == 200  # ... and the token kept


def _staff_with(codenames: list[str]) -> User:
    staff = User.objects.create_user("staffer", password="staffer-pw-9f2k", role=Role.VIEWER, is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return staff


def test_the_admin_cannot_hand_a_token_to_another_user() -> None:
    root = User.objects.create_superuser("root", password="root-pw-8d1x")
    staff = _staff_with(["view_apitoken", "change_apitoken"])
    issued = issue_api_token(staff, "mine")
    client = Client()
    client.force_login(staff)
    url = f"/admin/accounts/apitoken/{issued.record.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and 'name="user"' not in page.content.decode()
    assert client.post(url, {"user": root.pk, "name": "renamed"}).status_code == 302
    token = ApiToken.objects.get(pk=issued.record.pk)
    assert token.name == "renamed" and token.user_id == staff.pk  # the editable field saved, not the user
    assert _me(issued.plaintext).data == {"username": "staffer", "role": "viewer"}


def test_the_admin_cannot_move_a_key_or_bring_a_revoked_one_back(bob: User, charlie: User) -> None:
    root = User.objects.create_superuser("root", password="root-pw-8d1x")
    key = revoke_api_key(create_api_key(bob, "chat").record)
    client = Client()
    client.force_login(root)
    url = f"/admin/accounts/apikey/{key.pk}/change/"
    html = client.get(url).content.decode()
    assert 'name="owner"' not in html and 'name="revoked"' not in html
    form = {"owner": charlie.pk, "name": "chat", "requests_per_minute": 5, "tokens_per_day": 10}
    assert client.post(url, form).status_code == 302  # "revoked" left out: unticked on a live key
    key.refresh_from_db()
    assert key.requests_per_minute == 5  # edited ...
    assert key.owner_id == bob.pk and key.revoked is True  # ... but neither moved nor live again
    live = create_api_key(bob, "other").record
    revoke = {"name": "other", "requests_per_minute": 60, "tokens_per_day": 10, "revoked": "on"}
    assert client.post(f"/admin/accounts/apikey/{live.pk}/change/", revoke).status_code == 302
    assert ApiKey.objects.get(pk=live.pk).revoked is True  # revoking in the admin still works


@pytest.mark.parametrize("path", ["/accounts/password_reset/", "/accounts/reset/MQ/set-password/"])
def test_there_is_no_anonymous_password_reset(bob: User, path: str) -> None:
    bob.email = "bob@example.com"
    bob.save()
    client = Client()
    assert client.get(path).status_code == 404
    assert client.post(path, {"email": "bob@example.com"}).status_code == 404
    assert mail.outbox == []
    assert client.get("/accounts/login/").status_code == 200  # the other account pages stay
    client.force_login(bob)
    assert client.get("/accounts/password_change/").status_code == 200


def test_disabling_the_password_in_the_admin_ends_the_users_api_tokens(bob: User) -> None:
    # The admin's "Password-based authentication: Disabled" (set_unusable_password): how an admin
    # locks a compromised account out.
    token = issue_api_token(bob, "script").plaintext
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-pw-8d1x"))
    form = {"usable_password": "false", "unset-password": "1"}  # the form's "Disable" button
    page = client.post(f"/admin/accounts/user/{bob.pk}/password/", form)
    assert page.status_code == 302
    bob.refresh_from_db()
    assert not bob.has_usable_password()
    assert _me(token).status_code == 401


def test_a_save_that_leaves_the_password_out_keeps_the_tokens(bob: User) -> None:
    token = issue_api_token(bob, "script").plaintext
    bob.set_password("a-new-pass-7Qx!z")
    bob.save(update_fields=["email"])  # the new password is not written ...
    assert User.objects.get(pk=bob.pk).check_password("bob-pw-9f2k")
    assert _me(token).status_code == 200  # ... so it is no password change
