"""A job created by a user an admin deletes at the same moment, on PostgreSQL's row locks.

A delete locks the user's row, sets its jobs' ``created_by`` to NULL, then deletes the row. A job
inserted meanwhile waited for the row at commit (its foreign-key check) and then failed with an
IntegrityError (a 500). Creating a job now takes the user's row first: it either commits before
the delete (which then sets its creator to NULL) or finds the user gone and refuses, nothing
stored (OwnerGone, a 403)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from accounts.models import User
from django.db import connection
from django.db.models.sql import subqueries
from jobs.models import Job
from jobs.services import create_job

from tests.pg_locks import in_thread, wait_until_blocked

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def test_a_job_created_while_its_user_is_deleted_is_refused_and_nothing_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = User.objects.create_user(username="carol", password="carol-pw-8d2k")
    paused, go_on, errors = threading.Event(), threading.Event(), list[str]()
    delete_batch = subqueries.DeleteQuery.delete_batch

    def delete_batch_pausing(self: Any, pk_list: Any, using: str) -> Any:
        if self.model is User:  # the user's row is locked, its jobs' creator set to NULL
            paused.set()
            assert go_on.wait(30)
        return delete_batch(self, pk_list, using)

    monkeypatch.setattr(subqueries.DeleteQuery, "delete_batch", delete_batch_pausing)
    deleter = in_thread("delete", lambda: User.objects.get(pk=user.pk).delete(), errors)
    assert paused.wait(30)
    creator = in_thread("create", lambda: create_job("noop", {"steps": 1, "delay_s": 0.0}, user), errors)
    wait_until_blocked(None)  # the creator waits for the user's row
    go_on.set()
    for t in (deleter, creator):
        t.join(timeout=60)
        assert not t.is_alive()

    assert errors == [f"create: OwnerGone: user {user.pk} no longer exists"]
    assert not User.objects.exists() and not Job.objects.exists()
