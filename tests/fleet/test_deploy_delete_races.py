"""A deploy racing the delete of its model or its host, on PostgreSQL's row locks.

A model delete locks the model's row, then looks for deployments that protect it; a deploy
committed meanwhile inserted its deployment after that look: its foreign-key check waited for the
delete and failed when it committed (IntegrityError, a 500). A deploy during a host delete held
the host's row and waited for a device's, which the delete held as it waited for the host's:
PostgreSQL aborted the deploy as a deadlock. Now the deploy holds the
model's row (FOR KEY SHARE) and its host's row before it checks anything, and a host delete locks
the host's row first: whichever comes second waits for the first, and is refused with the reason
(the deploy: a 400 naming what was deleted; the delete: the model or host is in use)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from deployments import services as deployment_services
from deployments.models import Deployment
from deployments.services import create_deployment
from django.db import connection
from django.db.models import ProtectedError
from inventory import models as inventory_models
from inventory.models import Device, Host
from inventory.services import register_host
from registry import models as registry_models
from registry.models import ServedModel

from tests.pg_locks import backend_pid, in_thread, wait_until_blocked

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def gpu_host() -> tuple[Host, Device]:
    host = register_host("gpu-a", "10.0.0.5")
    return host, Device.objects.create(host=host, index=0, uuid="GPU-a-0", name="H100", memory_total_bytes=1)


def deleting_while(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    lock: str,
    delete: Callable[[], Any],
    deploy: Callable[[], Any],
) -> list[str]:
    """Run ``delete``, which pauses once ``module.<lock>`` returned (its locks held), start
    ``deploy`` and wait until it waits for one of them; then let the delete go on. Returns what
    either side raised ("name: Type: message")."""
    held, go_on = threading.Event(), threading.Event()
    locked = getattr(module, lock)

    def lock_then_pause(pks: Any) -> None:
        locked(pks)
        held.set()
        assert go_on.wait(30)

    monkeypatch.setattr(module, lock, lock_then_pause)
    errors: list[str] = []
    deleter = in_thread("delete", delete, errors)
    assert held.wait(30)
    pid: list[int] = []

    def deploy_recording_pid() -> None:
        pid.append(backend_pid())
        deploy()

    deployer = in_thread("deploy", deploy_recording_pid, errors)
    while not pid:
        threading.Event().wait(0.01)
    wait_until_blocked(pid[0])
    go_on.set()
    for thread in (deleter, deployer):
        thread.join(60)
        assert not thread.is_alive()
    return errors


def test_a_deploy_during_its_models_delete_waits_and_is_refused_naming_the_model(
    served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, device = gpu_host()
    errors = deleting_while(
        monkeypatch,
        registry_models,
        "lock_for_delete",
        lambda: ServedModel.objects.get(pk=served_model.pk).delete(),
        lambda: create_deployment(served_model, host, [device]),
    )
    assert errors == [f"deploy: PlacementError: Model {served_model.name} was deleted meanwhile."]
    assert not ServedModel.objects.exists() and not Deployment.objects.exists()


def test_a_deploy_during_its_hosts_delete_waits_and_is_refused_naming_the_host(
    served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, device = gpu_host()
    errors = deleting_while(
        monkeypatch,
        inventory_models,
        "lock_hosts_for_delete",
        lambda: Host.objects.get(pk=host.pk).delete(),
        lambda: create_deployment(served_model, host, [device]),
    )
    assert errors == ["deploy: PlacementError: Host gpu-a was deleted meanwhile."]
    assert not Host.objects.exists() and not Device.objects.exists() and not Deployment.objects.exists()


def test_a_model_delete_after_a_deploy_holds_the_model_waits_and_is_refused(
    served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, device = gpu_host()
    placed, go_on = threading.Event(), threading.Event()
    check = deployment_services.check_placement

    def check_then_pause(*args: Any, **kwargs: Any) -> None:
        check(*args, **kwargs)
        placed.set()
        assert go_on.wait(30)

    monkeypatch.setattr(deployment_services, "check_placement", check_then_pause)
    errors: list[str] = []
    deployer = in_thread("deploy", lambda: create_deployment(served_model, host, [device]), errors)
    assert placed.wait(30)
    pid: list[int] = []

    def delete() -> None:
        pid.append(backend_pid())
        ServedModel.objects.get(pk=served_model.pk).delete()

    deleter = in_thread("delete", delete, errors)
    while not pid:
        threading.Event().wait(0.01)
    wait_until_blocked(pid[0])
    go_on.set()
    for thread in (deployer, deleter):
        thread.join(60)
        assert not thread.is_alive()
    assert len(errors) == 1 and errors[0].startswith(f"delete: {ProtectedError.__name__}"), errors
    assert Deployment.objects.get().model_id == served_model.pk
