"""A model deleted while its profile job stores the profile, on PostgreSQL's row locks.

Deleting a model deletes its profile's row first (the collector's cascade), then the model's row;
storing a profile locked the model's row, then upserted the profile's row. Taken in opposite
orders, PostgreSQL aborted one of the two with "deadlock detected": the profile job (retried as a
transient error, its whole measurement again) or the operator's DELETE (a 500). A delete now
locks the profile's row and the model's before its cascade (the store's order), so it also waits
for a first profile being stored and deletes it with the model."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.db.models.sql import subqueries
from django.test import RequestFactory
from jobs.models import Job, JobStatus
from jobs.services import execute_job
from planning import profiling
from planning.models import ModelProfile
from registry.admin import ServedModelAdmin
from registry.models import ServedModel

from tests.pg_locks import backend_pid, in_thread, wait_until_blocked
from tests.planning.helpers import GIB, make_model, queued_profile_job, store_profile

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def _profiled_model_and_job(profiled: bool = True) -> tuple[ServedModel, Job]:
    model = make_model("llama-3-8b")
    if profiled:  # a profile exists: the delete cascades to its row
        store_profile(model, "producer", 4 * GIB)
    return model, queued_profile_job()


def delete_one(pk: int) -> None:
    ServedModel.objects.get(pk=pk).delete()


def delete_selected_in_the_admin(pk: int) -> None:
    request = RequestFactory().post("/admin/registry/servedmodel/")
    ServedModelAdmin(ServedModel, admin.site).delete_queryset(request, ServedModel.objects.filter(pk=pk))


def _race(
    model: ServedModel,
    job: Job,
    deleter_first: bool,
    monkeypatch: pytest.MonkeyPatch,
    delete: Callable[[int], None] = delete_one,
) -> list[str]:
    """Run the profile job and a delete of `model` in two threads. With `deleter_first` the delete
    has deleted the profile's row when the job stores the profile; else the job holds what it locks
    before its upsert when the delete starts. Returns the errors of the two."""
    errors: list[str] = []
    pids: dict[str, int] = {}
    ready = {"store": threading.Event(), "delete": threading.Event()}
    go_on = {"store": threading.Event(), "delete": threading.Event()}

    def pause(who: str) -> None:
        pids[who] = backend_pid()
        ready[who].set()
        assert go_on[who].wait(30)

    delete_batch = subqueries.DeleteQuery.delete_batch

    def delete_batch_pausing(self: Any, pk_list: Any, using: str) -> Any:
        if self.model is ServedModel and deleter_first:  # its profile's row is deleted already
            pause("delete")
        return delete_batch(self, pk_list, using)

    monkeypatch.setattr(subqueries.DeleteQuery, "delete_batch", delete_batch_pausing)
    measure = profiling.profile_model

    def measure_then_pause(*args: Any, **kwargs: Any) -> Any:
        profile = measure(*args, **kwargs)
        if deleter_first:
            pause("store")
        return profile

    monkeypatch.setattr(profiling, "profile_model", measure_then_pause)
    upsert = ModelProfile.objects.update_or_create

    def upsert_after_pause(*args: Any, **kwargs: Any) -> Any:
        if not deleter_first:  # what the store locks before its upsert is held
            pause("store")
        return upsert(*args, **kwargs)

    monkeypatch.setattr(ModelProfile.objects, "update_or_create", upsert_after_pause)

    if deleter_first:
        threads = [in_thread("delete", lambda: delete(model.pk), errors)]
        assert ready["delete"].wait(30)
        threads.append(in_thread("store", lambda: execute_job(job.pk), errors))
        assert ready["store"].wait(60)
        go_on["store"].set()
        wait_until_blocked(pids["store"])  # on the profile's row, deleted and locked by the delete
        go_on["delete"].set()
    else:
        threads = [in_thread("store", lambda: execute_job(job.pk), errors)]
        assert ready["store"].wait(60)
        go_on["delete"].set()  # never paused: runs through unless a lock stops it
        threads.append(in_thread("delete", lambda: delete(model.pk), errors))
        wait_until_blocked(None)  # the delete waits for a row the store holds
        go_on["store"].set()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    return errors


def test_a_delete_that_deleted_the_profile_row_first_fails_the_job_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, job = _profiled_model_and_job()

    assert _race(model, job, deleter_first=True, monkeypatch=monkeypatch) == []

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "ProfilingError: model 'llama-3-8b' was deleted while it was profiled; nothing was stored"
    )
    assert not ServedModel.objects.exists() and not ModelProfile.objects.exists()


def test_a_delete_started_while_the_profile_is_stored_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model, job = _profiled_model_and_job()

    assert _race(model, job, deleter_first=False, monkeypatch=monkeypatch) == []

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert not ServedModel.objects.exists() and not ModelProfile.objects.exists()


@pytest.mark.parametrize("delete", [delete_one, delete_selected_in_the_admin])
def test_a_delete_started_while_a_first_profile_is_stored_waits_for_it_and_deletes_it_too(
    monkeypatch: pytest.MonkeyPatch, delete: Callable[[int], None]
) -> None:
    """No profile row yet for the delete to lock: it locks the model's row before its cascade looks
    for one. Before, the cascade found none, the delete then waited for the model's row, and once
    the job had stored the first profile it failed at commit (IntegrityError, a 500)."""
    model, job = _profiled_model_and_job(profiled=False)

    assert _race(model, job, deleter_first=False, monkeypatch=monkeypatch, delete=delete) == []

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert not ServedModel.objects.exists() and not ModelProfile.objects.exists()
