"""Deployments: a model on the right number of free devices of one host."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from deployments.models import Deployment
from django.db import connection
from inventory.models import Device, Host
from registry.models import ServedModel
from rest_framework.test import APIClient

URL = "/api/v1/deployments/"
pytestmark = pytest.mark.django_db


def _host(name: str, gpus: int) -> list[Device]:
    host = Host.objects.create(name=name)
    return [
        Device.objects.create(host=host, index=i, uuid=f"{name}-{i}", name="L4", memory_total_bytes=24 << 30)
        for i in range(gpus)
    ]


@pytest.fixture
def setup(model_payload: dict[str, Any]) -> dict[str, Any]:
    model = ServedModel.objects.create(**model_payload)  # tensor_parallel_size=2
    return {"model": model, "a": _host("host-a", 4), "b": _host("host-b", 2)}


def test_it_deploys_and_changes_desired_state(admin_client: APIClient, setup: dict[str, Any]) -> None:
    a = setup["a"]
    body = {"model": "llama-3-8b", "host": "host-a", "devices": [a[0].pk, a[1].pk]}
    created = admin_client.post(URL, body, format="json")
    assert created.status_code == 201, created.data
    deployment = Deployment.objects.get(pk=created.data["id"])
    assert sorted(d.index for d in deployment.devices.all()) == [0, 1]
    assert (deployment.desired_state, deployment.observed_state) == ("running", "pending")
    assert created.data["converged"] is False

    stopped = admin_client.patch(f"{URL}{deployment.pk}/", {"desired_state": "stopped"}, format="json")
    assert stopped.status_code == 200, stopped.data
    deployment.refresh_from_db()
    assert deployment.desired_state == "stopped"


@pytest.mark.parametrize("case", ["too_few", "other_host", "duplicate"])
def test_it_rejects_devices_that_cannot_hold_the_model(
    admin_client: APIClient, setup: dict[str, Any], case: str
) -> None:
    a, b = setup["a"], setup["b"]
    devices = {
        "too_few": [a[0].pk],
        "other_host": [a[0].pk, b[0].pk],
        "duplicate": [a[0].pk, a[0].pk],
    }[case]
    response = admin_client.post(
        URL, {"model": "llama-3-8b", "host": "host-a", "devices": devices}, format="json"
    )
    assert response.status_code == 400
    assert "devices" in response.data
    assert Deployment.objects.count() == 0


def test_it_refuses_devices_another_running_deployment_uses(
    admin_client: APIClient, setup: dict[str, Any]
) -> None:
    a = setup["a"]
    first = {"model": "llama-3-8b", "host": "host-a", "devices": [a[0].pk, a[1].pk]}
    assert admin_client.post(URL, first, format="json").status_code == 201
    clash = admin_client.post(URL, {**first, "devices": [a[1].pk, a[2].pk]}, format="json")
    assert clash.status_code == 400
    assert Deployment.objects.count() == 1


def test_it_keeps_model_and_host_fixed(admin_client: APIClient, setup: dict[str, Any]) -> None:
    a = setup["a"]
    created = admin_client.post(
        URL, {"model": "llama-3-8b", "host": "host-a", "devices": [a[0].pk, a[1].pk]}, format="json"
    )
    response = admin_client.patch(f"{URL}{created.data['id']}/", {"host": "host-b"}, format="json")
    assert response.status_code == 400
    assert Deployment.objects.get().host.name == "host-a"


def test_it_forbids_viewers_to_deploy(viewer_client: APIClient, setup: dict[str, Any]) -> None:
    a = setup["a"]
    body = {"model": "llama-3-8b", "host": "host-a", "devices": [a[0].pk, a[1].pk]}
    assert viewer_client.post(URL, body, format="json").status_code == 403
    assert Deployment.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path")
def test_two_concurrent_deployments_cannot_take_the_same_devices(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deployments import services

    # Each request waits (up to 1 s) after its device check for the other to have checked too:
    # without a lock both checks see free devices and both deployments are created.
    both_checked = threading.Barrier(2)
    check = services.check_placement

    def slow_check(*args: Any, **kwargs: Any) -> None:
        check(*args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_checked.wait(timeout=1.0)

    monkeypatch.setattr(services, "check_placement", slow_check)
    model, host, a = setup["model"], Host.objects.get(name="host-a"), setup["a"]
    outcomes: list[str] = []

    def deploy() -> None:
        try:
            services.create_deployment(model, host, a[:2])
            outcomes.append("created")
        except services.PlacementError:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=deploy) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["created", "refused"]
    assert Deployment.objects.count() == 1


def test_it_refuses_to_delete_a_running_deployment_as_the_dashboard_does(
    admin_client: APIClient, setup: dict[str, Any]
) -> None:
    a = setup["a"]
    deployment = Deployment.objects.create(model=setup["model"], host=a[0].host)
    deployment.devices.set(a[:2])

    refused = admin_client.delete(f"{URL}{deployment.pk}/")

    assert refused.status_code == 409
    message = f"Deployment {deployment.pk} is meant to run: stop it before deleting it."
    assert refused.json() == {"detail": message}
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"


def test_it_deletes_a_stopped_deployment(
    admin_client: APIClient, viewer_client: APIClient, setup: dict[str, Any]
) -> None:
    a = setup["a"]
    deployment = Deployment.objects.create(model=setup["model"], host=a[0].host, desired_state="stopped")
    deployment.devices.set(a[:2])
    url = f"{URL}{deployment.pk}/"

    assert viewer_client.delete(url).status_code == 403
    assert Deployment.objects.filter(pk=deployment.pk).exists()
    assert admin_client.delete(url).status_code == 204
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert admin_client.delete(url).status_code == 404


def test_a_name_with_a_nul_character_is_a_400_naming_the_field(
    admin_client: APIClient, setup: dict[str, Any]
) -> None:
    # PostgreSQL text cannot hold NUL: looking such a name up raised DataError, a 500 (found by
    # test_api_bad_input_properties.py on PostgreSQL).
    a = setup["a"]
    body = {"model": "llama-3-8b\x00", "host": "host-a\x00", "devices": [a[0].pk, a[1].pk]}
    response = admin_client.post(URL, body, format="json")
    assert response.status_code == 400, response.data
    assert response.data == {
        "model": ["Null characters are not allowed."],
        "host": ["Null characters are not allowed."],
    }
    assert not Deployment.objects.exists()
    deployment = Deployment.objects.create(model=setup["model"], host=a[0].host)
    patched = admin_client.patch(f"{URL}{deployment.pk}/", {"host": "\x00"}, format="json")
    assert patched.status_code == 400 and patched.data == {"host": ["Null characters are not allowed."]}
    deployment.refresh_from_db()
    assert deployment.host == a[0].host
