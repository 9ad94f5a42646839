"""Deleting a user while a credential is being issued to them, on PostgreSQL's row locks.

An issue locks the user's row, then revokes and creates the user's keys or tokens; a delete locks
the user's row too before its cascade deletes them. So the two run one after the other: no
"deadlock detected", and an issue that waited for a delete finds the user gone and issues nothing
(before, it inserted a key for the deleted user and failed at commit with an IntegrityError)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from accounts import services
from accounts.admin import PlatformUserAdmin
from accounts.models import ApiKey, ApiToken, User
from django.contrib import admin
from django.db import connection, transaction
from django.test import Client, RequestFactory, override_settings
from rest_framework.test import APIClient

from tests.pg_locks import backend_pid, in_thread, wait_until_blocked

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def join(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def delete_one(user_pk: int) -> None:
    User.objects.get(pk=user_pk).delete()


def delete_selected_in_the_admin(user_pk: int) -> None:
    request = RequestFactory().post("/admin/accounts/user/")
    PlatformUserAdmin(User, admin.site).delete_queryset(request, User.objects.filter(pk=user_pk))


@override_settings(API_KEYS_PER_USER=2)
@pytest.mark.parametrize("delete_user", [delete_one, delete_selected_in_the_admin])
def test_a_delete_waits_for_a_playground_key_being_issued_then_deletes_it_too(
    bob: User, monkeypatch: pytest.MonkeyPatch, delete_user: Callable[[int], None]
) -> None:
    """bob is at his key limit, so the playground's issue revokes his older playground key. It has
    locked bob's row and counted his keys when the delete starts; it goes on once the delete waits.
    Before, the delete had already locked bob's keys (deleting them) and waited for his row, and the
    issue's revoke then waited for the delete: a deadlock, and PostgreSQL aborted one of them."""
    services.issue_playground_key(bob)
    services.create_api_key(bob, "own")
    deleter_pid: list[int] = []
    issuer_counted, deleter_connected = threading.Event(), threading.Event()
    count = services.live_api_keys

    def count_then_let_the_delete_start(owner: Any) -> int:
        live = count(owner)
        issuer_counted.set()
        assert deleter_connected.wait(10)
        wait_until_blocked(deleter_pid[0])
        return live

    monkeypatch.setattr(services, "live_api_keys", count_then_let_the_delete_start)

    def issue() -> None:
        services.issue_playground_key(User.objects.get(pk=bob.pk))

    def delete() -> None:
        deleter_pid.append(backend_pid())
        deleter_connected.set()
        assert issuer_counted.wait(10)
        delete_user(bob.pk)

    errors: list[str] = []
    join(in_thread("issue", issue, errors), in_thread("delete", delete, errors))
    assert errors == []
    assert not User.objects.filter(pk=bob.pk).exists()
    assert not ApiKey.objects.filter(owner_id=bob.pk).exists()


def delete_committed_once_a_request_waits(user: User, errors: list[str]) -> threading.Thread:
    """Delete ``user`` in a transaction that commits once another backend waits for a lock (the
    request started after the delete, so it saw the user, and waits for the user's row)."""
    deleted = threading.Event()

    def delete() -> None:
        with transaction.atomic():
            User.objects.get(pk=user.pk).delete()
            deleted.set()
            wait_until_blocked()

    thread = in_thread("delete", delete, errors)
    assert deleted.wait(10)
    return thread


def test_the_playground_issues_no_key_to_a_user_deleted_meanwhile(bob: User) -> None:
    browser = Client()
    browser.force_login(bob)
    responses: list[Any] = []
    errors: list[str] = []
    deleter = delete_committed_once_a_request_waits(bob, errors)

    def open_playground() -> None:
        responses.append(browser.post("/playground/key/"))

    join(deleter, in_thread("open_playground", open_playground, errors))
    assert errors == []
    assert responses[0].status_code == 401
    assert responses[0].json() == {"detail": "Log in to use the playground."}
    assert not ApiKey.objects.filter(owner_id=bob.pk).exists()


def test_signing_in_issues_no_token_to_a_user_deleted_meanwhile(bob: User) -> None:
    responses: list[Any] = []
    errors: list[str] = []
    deleter = delete_committed_once_a_request_waits(bob, errors)

    def sign_in() -> None:
        body = {"username": "bob", "password": "bob-pw-9f2k", "name": "cli"}
        responses.append(APIClient().post("/api/v1/auth/token/", body, format="json"))

    join(deleter, in_thread("sign_in", sign_in, errors))
    assert errors == []
    assert responses[0].status_code == 403
    assert not ApiToken.objects.filter(user_id=bob.pk).exists()
