"""Failed sign-ins are limited per username and address, per address and per username, on every
sign-in path."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from accounts import login_limits
from accounts.models import ApiToken, User
from django.contrib.auth import authenticate
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.db import DatabaseError
from django.test import Client, RequestFactory, override_settings
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

BOB_PASSWORD = "bob-pw-9f2k"
LOCKED = "Too many failed sign-ins"
IN_PROGRESS = "Too many sign-ins in progress for this username from this address; try again in a moment."


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    """The counters live in the cache, which outlives a test."""
    cache.clear()
    yield
    cache.clear()


@dataclass
class Attempt:
    status_code: int
    page: str
    signed_in: bool

    @property
    def locked(self) -> bool:
        return LOCKED in self.page


def sign_in(
    username: str, password: str, address: str = "10.0.0.1", path: str = "/accounts/login/"
) -> Attempt:
    """POST the sign-in form from ``address``; whether a session came of it."""
    client = Client(REMOTE_ADDR=address)
    response = client.post(path, {"username": username, "password": password})
    return Attempt(response.status_code, response.content.decode(), "_auth_user_id" in client.session)


def test_it_locks_a_username_only_from_the_address_that_guessed(
    bob: User, charlie: User, caplog: pytest.LogCaptureFixture
) -> None:
    """With the default limits: knowing bob's username is not enough to lock bob out."""
    for _ in range(5):
        failed = sign_in("bob", "guess", address="198.51.100.4")
        assert failed.status_code == 200 and not failed.signed_in and not failed.locked

    with caplog.at_level(logging.WARNING, logger="accounts"):
        refused = sign_in("bob", BOB_PASSWORD, address="198.51.100.4")
    assert refused.status_code == 200  # the form again, with the error
    assert refused.locked and not refused.signed_in
    assert "for this username from this address" in refused.page
    assert any(r.levelno == logging.WARNING and "'bob'" in r.getMessage() for r in caplog.records)
    assert sign_in("BOB", "guess", address="198.51.100.4").locked  # another spelling, the same count

    # Bob, from anywhere else, and charlie, from the same address, sign in.
    assert sign_in("bob", BOB_PASSWORD, address="10.0.0.9").signed_in
    assert sign_in("charlie", "charlie-pw-9f2k", address="198.51.100.4").signed_in


@override_settings(
    LOGIN_FAILURES_PER_USERNAME=3, LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=100, LOGIN_FAILURES_PER_ADDRESS=100
)
def test_it_locks_a_username_guessed_at_from_many_addresses_even_with_the_right_password(
    bob: User, charlie: User, caplog: pytest.LogCaptureFixture
) -> None:
    for attempt in range(3):
        failed = sign_in("bob", "guess", address=f"10.0.0.{attempt}")
        assert failed.status_code == 200 and not failed.signed_in and not failed.locked

    with caplog.at_level(logging.WARNING, logger="accounts"):
        refused = sign_in("bob", BOB_PASSWORD, address="10.0.0.9")
    assert refused.status_code == 200  # the form again, with the error
    assert refused.locked and not refused.signed_in
    assert any(r.levelno == logging.WARNING and "'bob'" in r.getMessage() for r in caplog.records)

    # The username is locked, not everyone: charlie signs in from the same address.
    assert sign_in("charlie", "charlie-pw-9f2k", address="10.0.0.9").signed_in
    # Another spelling of the username does not open a second budget.
    assert sign_in("BOB", "guess").locked


@override_settings(LOGIN_FAILURES_PER_USERNAME=100, LOGIN_FAILURES_PER_ADDRESS=3)
def test_it_locks_an_address_that_guesses_across_usernames(bob: User) -> None:
    for name in ("root", "admin", "operator"):
        assert not sign_in(name, "guess", address="203.0.113.7").signed_in

    refused = sign_in("bob", BOB_PASSWORD, address="203.0.113.7")
    assert refused.locked and not refused.signed_in
    assert sign_in("bob", BOB_PASSWORD, address="203.0.113.8").signed_in


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=3)
def test_the_admin_login_and_the_token_endpoint_share_the_limit(bob: User) -> None:
    User.objects.filter(pk=bob.pk).update(is_staff=True)
    for _ in range(3):
        assert not sign_in("bob", "guess", path="/admin/login/").signed_in

    admin = sign_in("bob", BOB_PASSWORD, path="/admin/login/")
    assert admin.status_code == 200
    assert admin.locked and not admin.signed_in

    credentials = {"username": "bob", "password": BOB_PASSWORD}
    response = APIClient(REMOTE_ADDR="10.0.0.1").post("/api/v1/auth/token/", credentials, format="json")
    assert response.status_code == 429
    assert LOCKED in response.json()["detail"]
    assert 0 < int(response["Retry-After"]) <= 900
    assert not ApiToken.objects.exists()

    response = APIClient(REMOTE_ADDR="10.0.0.5").post("/api/v1/auth/token/", credentials, format="json")
    assert response.status_code == 201


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=3)
def test_a_token_request_with_an_unknown_field_checks_no_password(bob: User) -> None:
    """Refused (400 naming the field) before the password is checked: it is neither a failure nor
    an attempt, whichever password it carries."""
    client = APIClient(REMOTE_ADDR="10.0.0.1")
    for password in ["guess"] * 4 + [BOB_PASSWORD]:
        body = {"username": "bob", "password": password, "nmae": "ci"}
        response = client.post("/api/v1/auth/token/", body, format="json")
        assert response.status_code == 400
        assert response.json() == {"nmae": ["Unknown field."]}
    assert not ApiToken.objects.exists()

    credentials = {"username": "bob", "password": BOB_PASSWORD}
    assert client.post("/api/v1/auth/token/", credentials, format="json").status_code == 201


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=3, LOGIN_FAILURE_WINDOW_S=60)
def test_the_lock_ends_with_the_window(bob: User, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        sign_in("bob", "guess")
    assert sign_in("bob", BOB_PASSWORD).locked

    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    assert sign_in("bob", BOB_PASSWORD).signed_in


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=3)
def test_a_successful_sign_in_clears_the_failures_of_its_username_from_its_address(bob: User) -> None:
    for _ in range(2):
        sign_in("bob", "guess")
    assert sign_in("bob", BOB_PASSWORD).signed_in
    for _ in range(2):
        sign_in("bob", "guess")
    assert sign_in("bob", BOB_PASSWORD).signed_in


@override_settings(LOGIN_FAILURES_PER_USERNAME=3, LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=100)
def test_a_successful_sign_in_leaves_the_usernames_own_count(bob: User) -> None:
    """Else each sign-in of the owner would give a guesser spread over addresses a fresh budget."""
    for address in ("10.0.1.1", "10.0.1.2"):
        sign_in("bob", "guess", address=address)
    assert sign_in("bob", BOB_PASSWORD, address="10.0.0.1").signed_in
    sign_in("bob", "guess", address="10.0.1.3")
    assert sign_in("bob", BOB_PASSWORD, address="10.0.0.1").locked


@override_settings(LOGIN_FAILURES_PER_USERNAME=2, LOGIN_FAILURES_PER_ADDRESS=2)
def test_the_owners_sign_ins_do_not_count_as_failures(bob: User) -> None:
    """Each sign-in is counted before its password is checked, and taken back when it succeeds."""
    for _ in range(4):
        assert sign_in("bob", BOB_PASSWORD).signed_in
    sign_in("bob", "guess", address="10.0.1.1")
    assert sign_in("bob", BOB_PASSWORD).signed_in
    sign_in("bob", "guess", address="10.0.1.2")
    assert sign_in("bob", BOB_PASSWORD).locked


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2, LOGIN_FAILURES_PER_USERNAME=4)
def test_guesses_refused_from_a_locked_address_do_not_spend_the_usernames_budget(bob: User) -> None:
    for _ in range(2):
        sign_in("bob", "guess", address="198.51.100.4")
    for _ in range(5):
        assert sign_in("bob", "guess", address="198.51.100.4").locked
    assert sign_in("bob", BOB_PASSWORD, address="10.0.0.9").signed_in


def token(username: str, password: str, address: str = "10.0.0.1") -> tuple[int, str, str | None]:
    """POST the token endpoint: (status, detail, Retry-After)."""
    credentials = {"username": username, "password": password}
    response = APIClient(REMOTE_ADDR=address).post("/api/v1/auth/token/", credentials, format="json")
    return response.status_code, response.json().get("detail", ""), response.get("Retry-After")


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=3)
def test_checks_in_flight_at_the_limit_refuse_for_a_moment_and_failures_at_it_for_the_window(
    bob: User,
) -> None:
    """Only failures lock for the rest of the window; a check in flight leaves its place in the
    budget when it ends, failed or not."""
    request = RequestFactory().post("/accounts/login/", REMOTE_ADDR="10.0.0.1")
    in_flight = [login_limits.begin_attempt(request, "bob") for _ in range(3)]

    page = sign_in("bob", BOB_PASSWORD)
    assert IN_PROGRESS in page.page and not page.locked and not page.signed_in
    assert token("bob", BOB_PASSWORD) == (429, IN_PROGRESS, "1")

    in_flight[0].failed()
    in_flight[1].failed()
    assert token("bob", BOB_PASSWORD) == (429, IN_PROGRESS, "1")  # 2 failures and 1 in flight

    in_flight[2].failed()
    status, detail, retry_after = token("bob", BOB_PASSWORD)
    assert status == 429 and detail.startswith(f"{LOCKED} for this username from this address;")
    assert retry_after is not None and 890 < int(retry_after) <= 900
    assert sign_in("bob", BOB_PASSWORD).locked
    assert not ApiToken.objects.exists()


@override_settings(LOGIN_FAILURES_PER_ADDRESS=2)
def test_a_successful_check_leaves_the_sign_ins_in_progress(bob: User, charlie: User) -> None:
    request = RequestFactory().post("/accounts/login/", REMOTE_ADDR="10.0.0.1")
    in_flight = [login_limits.begin_attempt(request, name) for name in ("charlie", "dave")]
    assert token("bob", BOB_PASSWORD)[:2] == (429, IN_PROGRESS.replace("for this username ", ""))

    in_flight[0].succeeded()
    assert token("bob", BOB_PASSWORD)[0] == 201


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2)
def test_a_check_that_raises_counts_as_a_failure(bob: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not as a check in flight until the window ends."""

    def unreachable_database(*args: object, **kwargs: object) -> None:
        raise DatabaseError("the database is unreachable")

    with monkeypatch.context() as patched:
        patched.setattr(ModelBackend, "authenticate", unreachable_database)
        for _ in range(2):
            with pytest.raises(DatabaseError):
                authenticate(RequestFactory().post("/", REMOTE_ADDR="10.0.0.1"), username="bob", password="x")

    refused = sign_in("bob", BOB_PASSWORD)
    assert refused.locked and IN_PROGRESS not in refused.page


def test_the_password_change_page_counts_wrong_old_passwords_as_failed_sign_ins(bob: User) -> None:
    """A signed-in session (a browser left open, a stolen cookie) cannot guess the account's password
    on the password change page past the sign-in limits, then change it and lock its owner out."""
    session = Client(REMOTE_ADDR="198.51.100.4")
    session.force_login(bob)
    new = {"new_password1": "n3w-pw-for-bob-7q", "new_password2": "n3w-pw-for-bob-7q"}
    for _ in range(5):
        wrong = session.post("/accounts/password_change/", {"old_password": "guess", **new})
        assert wrong.status_code == 200 and LOCKED not in wrong.content.decode()

    right = session.post("/accounts/password_change/", {"old_password": BOB_PASSWORD, **new})
    assert right.status_code == 200 and LOCKED in right.content.decode()
    bob.refresh_from_db()
    assert bob.check_password(BOB_PASSWORD)  # unchanged
    # The same budget as the sign-in page's: locked there too from that address, not elsewhere.
    assert sign_in("bob", BOB_PASSWORD, address="198.51.100.4").locked
    assert sign_in("bob", BOB_PASSWORD, address="10.0.0.9").signed_in


def test_the_password_change_page_still_changes_a_password(bob: User) -> None:
    session = Client(REMOTE_ADDR="198.51.100.4")
    session.force_login(bob)
    new = {"new_password1": "n3w-pw-for-bob-7q", "new_password2": "n3w-pw-for-bob-7q"}
    assert session.post("/accounts/password_change/", {"old_password": "guess", **new}).status_code == 200
    changed = session.post("/accounts/password_change/", {"old_password": BOB_PASSWORD, **new})
    assert changed.status_code == 302 and changed["Location"] == "/accounts/password_change/done/"
    bob.refresh_from_db()
    assert bob.check_password("n3w-pw-for-bob-7q")


def test_the_admins_password_change_page_counts_wrong_old_passwords_too(bob: User) -> None:
    bob.is_staff = True
    bob.save(update_fields=["is_staff"])
    session = Client(REMOTE_ADDR="198.51.100.4")
    session.force_login(bob)
    new = {"new_password1": "n3w-pw-for-bob-7q", "new_password2": "n3w-pw-for-bob-7q"}
    for _ in range(5):
        wrong = session.post("/admin/password_change/", {"old_password": "guess", **new})
        assert wrong.status_code == 200 and LOCKED not in wrong.content.decode()
    right = session.post("/admin/password_change/", {"old_password": BOB_PASSWORD, **new})
    assert right.status_code == 200 and LOCKED in right.content.decode()
    bob.refresh_from_db()
    assert bob.check_password(BOB_PASSWORD)

    elsewhere = Client(REMOTE_ADDR="10.0.0.9")
    elsewhere.force_login(bob)
    assert "Django administration" in elsewhere.get("/admin/password_change/").content.decode()
    changed = elsewhere.post("/admin/password_change/", {"old_password": BOB_PASSWORD, **new})
    assert changed.status_code == 302 and changed["Location"] == "/admin/password_change/done/"
    assert Client().get("/admin/password_change/").status_code == 302  # signed out: the admin's sign-in
