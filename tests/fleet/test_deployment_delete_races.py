"""A deployment deleted while its agent's connection writes rows that refer to it, on PostgreSQL's
row locks.

A delete's cascade deletes the rows that refer to the deployment (its replica, its samples), then
the deployment's row. A first replica (a status storing one holds the deployment's row locked) or
a telemetry frame committed between the two made the delete fail at commit (IntegrityError, a 500
to the operator). A delete now locks the deployment's row before its cascade: a status being
stored is stored first and deleted with the deployment; a telemetry write waits for the delete and
is then stored without the deleted deployment's rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from agents import services
from agents.ingest import rows_for, write_dropping_deleted
from agents.models import DeviceSample, EngineSample, Replica
from agents.services import LinkedHost
from deployments.admin import DeploymentAdmin
from deployments.models import Deployment, DesiredState
from deployments.services import delete_stopped_deployment
from django.contrib import admin
from django.db import connection
from django.db.models.sql import subqueries
from django.test import RequestFactory
from inventory.models import Device
from inventory.services import register_host
from registry.models import ServedModel

from gpu_agent.protocol import DeploymentStatus, Telemetry, parse_frame
from tests.pg_locks import backend_pid, in_thread, wait_until_blocked

from .conftest import device_sample, telemetry_frame

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def delete_one(pk: int) -> None:
    # The API's DELETE and the dashboard's (a stopped deployment: a running one is refused).
    delete_stopped_deployment(Deployment.objects.get(pk=pk))


def delete_selected_in_the_admin(pk: int) -> None:
    request = RequestFactory().post("/admin/deployments/deployment/")
    DeploymentAdmin(Deployment, admin.site).delete_queryset(request, Deployment.objects.filter(pk=pk))


DELETES = [delete_one, delete_selected_in_the_admin]


def deployed(served_model: ServedModel) -> tuple[LinkedHost, Deployment]:
    host = register_host("gpu-a", "10.0.0.5")
    device = Device.objects.create(
        host=host, index=0, uuid="GPU-a-0", name="H100", memory_total_bytes=80 << 30
    )
    # Stopped (by the operator) but its agent still reports it: it is being stopped.
    deployment = Deployment.objects.create(model=served_model, host=host, desired_state=DesiredState.STOPPED)
    deployment.devices.add(device)
    return LinkedHost(host.pk, host.name, "10.0.0.5", False, {0: device.pk}, {deployment.pk}), deployment


class Pauses:
    """Named points where a side waits until the test lets it go on."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.ready: dict[str, threading.Event] = {}
        self.go_on: dict[str, threading.Event] = {}

    def pause(self, who: str) -> None:
        self.pids[who] = backend_pid()
        self.ready.setdefault(who, threading.Event()).set()
        assert self.go_on.setdefault(who, threading.Event()).wait(30)

    def wait_ready(self, who: str) -> None:
        assert self.ready.setdefault(who, threading.Event()).wait(30)

    def release(self, who: str) -> None:
        self.go_on.setdefault(who, threading.Event()).set()


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()


@pytest.mark.parametrize("delete", DELETES)
def test_a_delete_started_while_a_first_status_is_stored_waits_for_it_and_deletes_its_replica(
    served_model: ServedModel, monkeypatch: pytest.MonkeyPatch, delete: Callable[[int], None]
) -> None:
    linked, deployment = deployed(served_model)
    frame = parse_frame(
        {
            "v": 1,
            "type": "deployment_status",
            "deployment_id": str(deployment.pk),
            "state": "starting",
            "ts": time.time(),
        }
    )
    assert isinstance(frame, DeploymentStatus)
    pauses, errors = Pauses(), list[str]()
    upsert = Replica.objects.update_or_create

    def upsert_after_pause(*args: Any, **kwargs: Any) -> Any:
        pauses.pause("status")  # the status holds the deployment's row locked
        return upsert(*args, **kwargs)

    monkeypatch.setattr(Replica.objects, "update_or_create", upsert_after_pause)
    threads = [in_thread("status", lambda: services.report_status(linked, frame), errors)]
    pauses.wait_ready("status")
    threads.append(in_thread("delete", lambda: delete(deployment.pk), errors))
    wait_until_blocked(None)  # the delete waits for the deployment's row
    pauses.release("status")
    join(threads)

    assert errors == []
    assert not Deployment.objects.exists() and not Replica.objects.exists()


@pytest.mark.parametrize("delete", DELETES)
def test_a_telemetry_write_during_a_delete_waits_for_it_and_stores_the_rest_of_its_frame(
    served_model: ServedModel, monkeypatch: pytest.MonkeyPatch, delete: Callable[[int], None]
) -> None:
    linked, deployment = deployed(served_model)
    engine = {"deployment_id": str(deployment.pk), "state": "running", "running": 1, "waiting": 0}
    frame = parse_frame(telemetry_frame([device_sample(0)], [engine]))
    assert isinstance(frame, Telemetry)
    batch = rows_for(linked, frame)  # built before the delete, written while it runs
    pauses, errors = Pauses(), list[str]()
    delete_batch = subqueries.DeleteQuery.delete_batch

    def delete_batch_pausing(self: Any, pk_list: Any, using: str) -> Any:
        if self.model is Deployment:  # the cascade deleted the deployment's samples already
            pauses.pause("delete")
        return delete_batch(self, pk_list, using)

    monkeypatch.setattr(subqueries.DeleteQuery, "delete_batch", delete_batch_pausing)
    threads = [in_thread("delete", lambda: delete(deployment.pk), errors)]
    pauses.wait_ready("delete")

    def write() -> None:
        pauses.pids["write"] = backend_pid()
        write_dropping_deleted([batch])

    writer = in_thread("write", write, errors)
    threads.append(writer)
    while writer.is_alive() and "write" not in pauses.pids:
        time.sleep(0.01)
    # Written at once (before, then the delete failed), or waiting for the delete (now).
    while writer.is_alive():
        try:
            wait_until_blocked(pauses.pids["write"], timeout=0.2)
            break
        except AssertionError:
            pass
    pauses.release("delete")
    join(threads)

    assert errors == []
    assert not Deployment.objects.exists() and not EngineSample.objects.exists()
    assert DeviceSample.objects.count() == 1
