"""A device, host or model deleted in the admin while a deployment is placed on it, on PostgreSQL's
row locks.

The admin checked that no deployment used the device (the device inline), the host or the model
(the delete page, the "Delete selected" action) before the host's or model's row was locked; a
deployment placed between that check and the delete made it refuse with ProtectedError, a 500.
Now the check holds the row, as placing a deployment does: the deploy waits for the delete, then
is refused (its device, host or model is gone), and the delete succeeds."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from accounts.models import User
from deployments.models import Deployment
from deployments.services import create_deployment
from django.db import connection
from django.test import Client
from inventory.admin import DeviceFormSet, HostAdmin
from inventory.models import Device, Host
from inventory.services import register_host
from registry.admin import ServedModelAdmin
from registry.models import ServedModel

from tests.control_plane.test_host_admin import inline_form
from tests.pg_locks import in_thread

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def another_backend_waits() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_locks WHERE NOT granted AND pid <> pg_backend_pid()")
        return cursor.fetchone() is not None


def a_placeable_model() -> tuple[Host, Device, ServedModel]:
    """A host with one unused device and a model that fits it."""
    host = register_host("gpu-a", "10.0.0.5")
    device = Device.objects.create(host=host, index=0, uuid="GPU-0", name="H100", memory_total_bytes=80 << 30)
    model = ServedModel.objects.create(
        name="m", source="/m", max_context_length=256, slo_ttft_p99_ms=1.0, slo_tbt_p99_ms=1.0
    )
    return host, device, model


def deploy_until_it_commits_or_waits(
    model: ServedModel, host: Host, device: Device, errors: list[str]
) -> threading.Thread:
    """Place the model on the device in a thread; return once it has finished or waits on a lock."""
    deploy = in_thread("deploy", lambda: create_deployment(model, host, [device]), errors)
    while deploy.is_alive() and not another_backend_waits():
        time.sleep(0.02)
    return deploy


def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-pw-8d1x"))
    return client


def admin_delete(client: Client, changelist: str, pk: int, how: str) -> Any:
    """Delete one row in the admin, by its delete page or by the changelist's "Delete selected"."""
    if how == "delete page":
        return client.post(f"{changelist}{pk}/delete/", {"post": "yes"})
    form = {"action": "delete_selected", "_selected_action": [str(pk)], "post": "yes"}
    return client.post(changelist, form)


def test_a_deployment_placed_while_the_admin_deletes_its_device_waits_and_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host, device, model = a_placeable_model()
    errors: list[str] = []
    deploys: list[threading.Thread] = []
    checked = DeviceFormSet.clean

    def deploy_once_checked(formset: Any) -> None:
        checked(formset)  # the device is unused: the delete is allowed
        # The deploy either commits (the check was not under the host's lock) or waits for it.
        deploys.append(deploy_until_it_commits_or_waits(model, host, device, errors))

    monkeypatch.setattr(DeviceFormSet, "clean", deploy_once_checked)
    client = superuser_client()
    answer = client.post(f"/admin/inventory/host/{host.pk}/change/", inline_form(host, {device.pk}))
    assert answer.status_code == 302
    for deploy in deploys:
        deploy.join(30)
    assert len(deploys) == 1
    assert not Device.objects.filter(pk=device.pk).exists()
    assert not Deployment.objects.exists()
    assert len(errors) == 1 and errors[0].startswith("deploy: PlacementError"), errors


@pytest.mark.parametrize("how", ["delete page", "delete selected"])
def test_a_deployment_placed_while_the_admin_deletes_its_host_waits_and_is_refused(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    host, device, model = a_placeable_model()
    errors: list[str] = []
    deploys: list[threading.Thread] = []
    checked = HostAdmin.get_deleted_objects

    def deploy_once_checked(admin: Any, objs: Any, request: Any) -> Any:
        found = checked(admin, objs, request)  # nothing protects the host: the delete is allowed
        if request.POST.get("post") and not deploys:  # the confirmed delete, not its question
            deploys.append(deploy_until_it_commits_or_waits(model, host, device, errors))
        return found

    monkeypatch.setattr(HostAdmin, "get_deleted_objects", deploy_once_checked)
    client = superuser_client()
    answer = admin_delete(client, "/admin/inventory/host/", host.pk, how)
    assert answer.status_code == 302
    for deploy in deploys:
        deploy.join(30)
    assert len(deploys) == 1
    assert not Host.objects.filter(pk=host.pk).exists()
    assert not Deployment.objects.exists()
    assert len(errors) == 1 and errors[0].startswith("deploy: PlacementError"), errors


@pytest.mark.parametrize("how", ["delete page", "delete selected"])
def test_a_deployment_placed_while_the_admin_deletes_its_model_waits_and_is_refused(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    host, device, model = a_placeable_model()
    errors: list[str] = []
    deploys: list[threading.Thread] = []
    checked = ServedModelAdmin.get_deleted_objects

    def deploy_once_checked(admin: Any, objs: Any, request: Any) -> Any:
        found = checked(admin, objs, request)  # nothing protects the model: the delete is allowed
        if request.POST.get("post") and not deploys:
            deploys.append(deploy_until_it_commits_or_waits(model, host, device, errors))
        return found

    monkeypatch.setattr(ServedModelAdmin, "get_deleted_objects", deploy_once_checked)
    client = superuser_client()
    answer = admin_delete(client, "/admin/registry/servedmodel/", model.pk, how)
    assert answer.status_code == 302
    for deploy in deploys:
        deploy.join(30)
    assert len(deploys) == 1
    assert not ServedModel.objects.filter(pk=model.pk).exists()
    assert not Deployment.objects.exists()
    assert len(errors) == 1 and errors[0].startswith("deploy: PlacementError"), errors
