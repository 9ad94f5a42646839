"""A REST write whose row another request deletes between the read and the write answers 404
(nothing is written back, no 500), as the dashboard's actions do; a key edit does not undo a revoke
made meanwhile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from accounts.api.views import ApiKeyViewSet
from accounts.models import ApiKey, User
from accounts.services import create_api_key
from deployments.api.serializers import DeploymentSerializer
from deployments.api.views import DeploymentViewSet
from deployments.models import Deployment
from django.test import Client
from inventory.models import Device, Host
from registry.api.views import ServedModelViewSet
from registry.models import ServedModel
from rest_framework.generics import GenericAPIView
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def read_then(
    monkeypatch: pytest.MonkeyPatch, view: type[GenericAPIView[Any]], meanwhile: Callable[[Any], object]
) -> None:
    """``view.get_object`` reads the row, then another request does ``meanwhile(row)``."""
    get_object = view.get_object

    def read_then_changed(self: Any) -> Any:
        found = get_object(self)
        meanwhile(found)
        return found

    monkeypatch.setattr(view, "get_object", read_then_changed)


def deleted(row: Any) -> None:
    type(row).objects.filter(pk=row.pk).delete()


@pytest.fixture
def deployment(model_payload: dict[str, Any]) -> Deployment:
    model = ServedModel.objects.create(**model_payload)  # tensor_parallel_size=2
    host = Host.objects.create(name="host-a")
    devices = [
        Device.objects.create(host=host, index=i, uuid=f"a-{i}", name="L4", memory_total_bytes=24 << 30)
        for i in range(4)
    ]
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set(devices[:2])
    return deployment


@pytest.mark.parametrize(
    "change", [{"desired_state": "stopped"}, {"devices": "other"}], ids=["desired_state", "devices"]
)
def test_a_deployment_patch_after_a_delete_is_a_404(
    admin_client: APIClient, deployment: Deployment, change: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    if change.get("devices") == "other":
        change = {"devices": list(Device.objects.filter(index__in=[2, 3]).values_list("pk", flat=True))}
    read_then(monkeypatch, DeploymentViewSet, deleted)
    response = admin_client.patch(f"/api/v1/deployments/{deployment.pk}/", change, format="json")
    assert response.status_code == 404, response.content
    assert not Deployment.objects.exists()


def test_a_revoke_after_a_delete_is_a_404(
    viewer_client: APIClient, bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_api_key(bob, "laptop").record
    read_then(monkeypatch, ApiKeyViewSet, deleted)
    response = viewer_client.post(f"/api/v1/api-keys/{key.pk}/revoke/")
    assert response.status_code == 404, response.content
    assert not ApiKey.objects.exists()


def test_a_key_patch_after_a_delete_is_a_404_and_recreates_nothing(
    viewer_client: APIClient, bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_api_key(bob, "laptop").record
    read_then(monkeypatch, ApiKeyViewSet, deleted)
    response = viewer_client.patch(f"/api/v1/api-keys/{key.pk}/", {"name": "desk"}, format="json")
    assert response.status_code == 404, response.content
    assert not ApiKey.objects.exists()


def test_a_key_patch_keeps_a_revoke_made_meanwhile(
    viewer_client: APIClient, bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_api_key(bob, "laptop").record
    read_then(monkeypatch, ApiKeyViewSet, lambda row: ApiKey.objects.filter(pk=row.pk).update(revoked=True))
    response = viewer_client.patch(f"/api/v1/api-keys/{key.pk}/", {"name": "desk"}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["name"], response.json()["revoked"]) == ("desk", True)
    key.refresh_from_db()
    assert (key.name, key.revoked) == ("desk", True)


def test_the_dashboards_revoke_after_a_delete_is_a_404(bob: User, monkeypatch: pytest.MonkeyPatch) -> None:
    from dashboard import keys

    key = create_api_key(bob, "laptop").record
    get_object_or_404 = keys.get_object_or_404

    def read_then_deleted(*args: Any, **kwargs: Any) -> Any:
        found = get_object_or_404(*args, **kwargs)
        deleted(found)
        return found

    monkeypatch.setattr(keys, "get_object_or_404", read_then_deleted)
    client = Client()
    client.force_login(bob)
    assert client.post(f"/api-keys/{key.pk}/revoke/").status_code == 404
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize("method", ["patch", "put"])
def test_a_model_edit_after_a_delete_is_a_404_and_recreates_nothing(
    admin_client: APIClient, model_payload: dict[str, Any], method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ServedModel.objects.create(**model_payload)
    read_then(monkeypatch, ServedModelViewSet, deleted)
    change = {**model_payload, "source": "/models/other"} if method == "put" else {"source": "/models/other"}
    response = getattr(admin_client, method)(f"/api/v1/models/{model.pk}/", change, format="json")
    assert response.status_code == 404, response.content  # was a 500 (DoesNotExist)
    assert not ServedModel.objects.exists()


def test_the_dashboards_model_edit_after_a_delete_is_a_404(
    alice: User, model_payload: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard import views

    model = ServedModel.objects.create(**model_payload)
    get_object_or_404 = views.get_object_or_404

    def read_then_deleted(*args: Any, **kwargs: Any) -> Any:
        found = get_object_or_404(*args, **kwargs)
        deleted(found)
        return found

    monkeypatch.setattr(views, "get_object_or_404", read_then_deleted)
    client = Client()
    client.force_login(alice)
    form = {name: str(value) for name, value in model_payload.items() if name != "engine_options"}
    response = client.post(f"/models/{model.pk}/edit/", {**form, "source": "/models/other"})
    assert response.status_code == 404
    assert not ServedModel.objects.exists()


def validated_then(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[dict[str, Any]], object]) -> None:
    """A deployment's serializer has read the model, host and devices it names; then another
    request does ``meanwhile(attrs)``, before the deployment is written."""
    validate = DeploymentSerializer.validate

    def validated_then_changed(self: Any, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = validate(self, attrs)
        meanwhile(attrs)
        return attrs

    monkeypatch.setattr(DeploymentSerializer, "validate", validated_then_changed)


# What a deploy names, deleted by another request after the deploy read it: the model (its API
# delete or its page's), the host (the Django admin), a device (its agent registering without it).
# Writing the deployment then failed on a foreign key or read a missing row: a 500.
DELETED_AFTER_READING = {
    "model": lambda attrs: attrs["model"].delete(),
    "host": lambda attrs: attrs["host"].delete(),
    "devices": lambda attrs: attrs["devices"][1].delete(),
}


@pytest.mark.parametrize("field", sorted(DELETED_AFTER_READING))
def test_a_deploy_whose_model_host_or_device_was_deleted_meanwhile_is_a_400_naming_it(
    admin_client: APIClient, model_payload: dict[str, Any], field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ServedModel.objects.create(**model_payload)  # tensor_parallel_size=2
    host = Host.objects.create(name="host-a")
    devices = [
        Device.objects.create(host=host, index=i, uuid=f"a-{i}", name="L4", memory_total_bytes=24 << 30)
        for i in range(2)
    ]
    validated_then(monkeypatch, DELETED_AFTER_READING[field])
    body = {"model": model.name, "host": host.name, "devices": [d.pk for d in devices]}
    response = admin_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 400, response.content
    [message] = response.json()[field]
    assert "deleted meanwhile" in message
    assert not Deployment.objects.exists()


def test_the_dashboards_deploy_of_a_model_deleted_meanwhile_is_refused_with_the_reason(
    alice: User, model_payload: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ServedModel.objects.create(**{**model_payload, "tensor_parallel_size": 1})
    host = Host.objects.create(name="host-a")
    Device.objects.create(host=host, index=0, uuid="a-0", name="L4", memory_total_bytes=24 << 30)
    validated_then(monkeypatch, DELETED_AFTER_READING["model"])
    client = Client()
    client.force_login(alice)
    response = client.post(f"/models/{model.pk}/deploy/", {"host": "host-a", "gpus": "0"})
    assert response.status_code == 400
    assert f"Model {model.name} was deleted meanwhile." in response.content.decode()
    assert not Deployment.objects.exists()
