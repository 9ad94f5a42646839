"""An admin deploys a model, stops, starts and deletes its deployments and deletes the model from the
model's page, under the REST API's rules: each refusal is shown on the page (400/409) and changes
nothing. A viewer is shown none of these controls and is refused a forged post."""

from __future__ import annotations

from typing import Any

import pytest
from dashboard import deploy_views
from deployments.models import Deployment, DesiredState, ObservedState
from django.shortcuts import get_object_or_404
from django.test import Client
from inventory.models import Device, Host, HostStatus
from inventory.services import register_host
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

CONTROLS = ('id="deploy-form"', 'id="delete-model"', 'id="stop-', 'id="start-', 'id="delete-')


def _page(client: Client, model: ServedModel) -> str:
    response = client.get(f"/models/{model.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def _indices(deployment: Deployment) -> list[int]:
    return sorted(deployment.devices.values_list("index", flat=True))


def test_only_admins_are_shown_the_controls(
    admin_client: Client, viewer_client: Client, deployment: Deployment
) -> None:
    admin = _page(admin_client, deployment.model)
    viewer = _page(viewer_client, deployment.model)
    assert (
        f'id="stop-{deployment.pk}"' in admin and 'id="deploy-form"' in admin and 'id="delete-model"' in admin
    )
    assert not [c for c in CONTROLS if c in viewer]


def test_the_deploy_form_lists_online_hosts_first_and_marks_the_others(
    admin_client: Client, served_model: ServedModel, host: Host
) -> None:
    register_host("gpu-b", "127.0.0.2")
    Host.objects.filter(name="gpu-b").update(status=HostStatus.ONLINE)
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)
    page = _page(admin_client, served_model)
    online, offline = '<option value="gpu-b">gpu-b</option>', '<option value="sim-a">sim-a (offline)</option>'
    assert page.index(online) < page.index(offline)


def test_an_admin_deploys_a_model_on_gpus_of_a_host(
    admin_client: Client, served_model: ServedModel, host: Host
) -> None:
    url = f"/models/{served_model.pk}/"
    response = admin_client.post(f"{url}deploy/", {"host": host.name, "gpus": "1"})
    assert response.status_code == 302 and response["Location"] == url
    deployment = Deployment.objects.get(model=served_model)
    assert deployment.host == host and _indices(deployment) == [1]
    assert deployment.desired_state == DesiredState.RUNNING
    page = _page(admin_client, served_model)
    assert f'id="notice">Deployment {deployment.pk} created on sim-a.</p>' in page


@pytest.mark.parametrize(
    ("gpus", "tp", "error"),
    [
        ("7", 1, "Host sim-a has no GPU 7."),
        ("zero", 1, "Not a GPU index: &#x27;zero&#x27; (list indices such as 0,1)."),
        ("", 1, "List the GPU indices to deploy on (such as 0,1)."),
        ("0", 1, "Devices already used by: deployment {deployment} (tiny@sim-a)."),
        ("1", 2, "Model tiny needs 2 device(s) (its tensor-parallel size); got 1."),
        ("1,1", 1, "A device is listed twice."),
        ("99999999999999999999", 1, "Host sim-a has no GPU 99999999999999999999."),
        ("\u00b2", 1, "Not a GPU index: &#x27;\u00b2&#x27; (list indices such as 0,1)."),
        ("\u0661", 1, "Not a GPU index: &#x27;\u0661&#x27; (list indices such as 0,1)."),
        ("9" * 5000, 1, "Not a GPU index: &#x27;99999999999999999999…&#x27; (list indices such as 0,1)."),
    ],
    ids=[
        "no-such-gpu",
        "not-an-index",
        "none",
        "gpu-in-use",
        "fewer-than-tp",
        "twice",
        "huge",
        "superscript",
        "arabic-indic",  # isdecimal(), and int() reads it as 1: it deployed on GPU 1
        "past-int",  # int() refuses it: the message was Python's, naming sys.set_int_max_str_digits
    ],
)
def test_a_refused_deploy_shows_the_error_beside_the_gpus_and_creates_nothing(
    admin_client: Client, deployment: Deployment, gpus: str, tp: int, error: str
) -> None:
    model = deployment.model
    if tp != model.tensor_parallel_size:
        ServedModel.objects.filter(pk=model.pk).update(tensor_parallel_size=tp)
        Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
    response = admin_client.post(f"/models/{model.pk}/deploy/", {"host": "sim-a", "gpus": gpus})
    assert response.status_code == 400
    page = response.content.decode()
    error = error.replace("{deployment}", str(deployment.pk))
    assert f'<p class="field-error" data-field="gpus">{error}</p>' in page
    assert f'value="{gpus}"' in page  # what was typed is kept
    assert list(Deployment.objects.values_list("pk", flat=True)) == [deployment.pk]


def test_a_deploy_on_an_unknown_host_is_refused(admin_client: Client, served_model: ServedModel) -> None:
    response = admin_client.post(f"/models/{served_model.pk}/deploy/", {"host": "nowhere", "gpus": "0"})
    assert response.status_code == 400
    assert "No host named &#x27;nowhere&#x27;." in response.content.decode()
    assert not Deployment.objects.exists()


def test_a_deploy_on_a_host_name_holding_nul_is_refused(
    admin_client: Client, served_model: ServedModel, host: Host
) -> None:
    # Looked up as given, it was a 500 on PostgreSQL (its text cannot hold NUL); found by the
    # dashboard's bad-input walk.
    response = admin_client.post(f"/models/{served_model.pk}/deploy/", {"host": "sim-a\x00", "gpus": "0"})
    assert response.status_code == 400
    assert "No host named &#x27;sim-a\\x00&#x27;." in response.content.decode()
    assert not Deployment.objects.exists()
    pasted = admin_client.post(f"/models/{served_model.pk}/deploy/", {"host": "h" * 5000, "gpus": "0"})
    assert pasted.status_code == 400  # the refusal names it, cut to 40 characters
    assert f"No host named &#x27;{'h' * 40}…&#x27;." in pasted.content.decode()


def test_an_admin_stops_and_starts_a_deployment(admin_client: Client, deployment: Deployment) -> None:
    url = f"/models/{deployment.model_id}/"
    response = admin_client.post(f"/deployments/{deployment.pk}/stop/")
    assert response.status_code == 302 and response["Location"] == url
    deployment.refresh_from_db()
    # The agent never reported an engine of it: stopped at once (deployments.services._settle_stop).
    assert (
        deployment.desired_state == DesiredState.STOPPED
        and deployment.observed_state == ObservedState.STOPPED
    )
    page = _page(admin_client, deployment.model)
    assert f"Deployment {deployment.pk} stopped." in page and f'id="start-{deployment.pk}"' in page

    response = admin_client.post(f"/deployments/{deployment.pk}/start/")
    assert response.status_code == 302 and response["Location"] == url
    deployment.refresh_from_db()
    assert deployment.desired_state == DesiredState.RUNNING
    assert f"Deployment {deployment.pk} started." in _page(admin_client, deployment.model)


def test_a_start_on_devices_another_deployment_took_is_refused(
    admin_client: Client, deployment: Deployment
) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
    other = Deployment.objects.create(model=deployment.model, host=deployment.host)
    other.devices.set([Device.objects.get(host=deployment.host, index=0)])
    response = admin_client.post(f"/deployments/{deployment.pk}/start/")
    assert response.status_code == 400
    assert (
        f'id="refusal">Deployment {deployment.pk} not started: Devices already used by: '
        f"deployment {other.pk} (tiny@sim-a).</p>" in response.content.decode()
    )
    deployment.refresh_from_db()
    assert deployment.desired_state == DesiredState.STOPPED


@pytest.mark.parametrize("action", ["stop", "start", "delete"])
def test_a_deployment_deleted_since_it_was_read_is_a_404(
    admin_client: Client, deployment: Deployment, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_then_deleted(*args: Any, **kwargs: Any) -> Any:  # another request deletes it meanwhile
        found = get_object_or_404(*args, **kwargs)
        Deployment.objects.filter(pk=found.pk).delete()
        return found

    Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
    monkeypatch.setattr(deploy_views, "get_object_or_404", read_then_deleted)
    assert admin_client.post(f"/deployments/{deployment.pk}/{action}/").status_code == 404


def test_a_running_deployment_is_not_deleted(admin_client: Client, deployment: Deployment) -> None:
    response = admin_client.post(f"/deployments/{deployment.pk}/delete/")
    assert response.status_code == 409
    message = f"Deployment {deployment.pk} is meant to run: stop it before deleting it."
    assert f'id="refusal">{message}</p>' in response.content.decode()
    assert Deployment.objects.filter(pk=deployment.pk).exists()


def test_a_stopped_deployment_is_deleted(admin_client: Client, deployment: Deployment) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
    response = admin_client.post(f"/deployments/{deployment.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == f"/models/{deployment.model_id}/"
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert f"Deployment {deployment.pk} deleted." in _page(admin_client, deployment.model)


def test_a_model_with_deployments_is_not_deleted(admin_client: Client, deployment: Deployment) -> None:
    response = admin_client.post(f"/models/{deployment.model_id}/delete/")
    assert response.status_code == 409
    message = f"Cannot delete: still referred to by deployments {deployment.pk}. Delete those first."
    assert f'id="refusal">{message}</p>' in response.content.decode()
    assert ServedModel.objects.filter(pk=deployment.model_id).exists()


def test_a_model_without_deployments_is_deleted(admin_client: Client, served_model: ServedModel) -> None:
    response = admin_client.post(f"/models/{served_model.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == "/models/"
    assert not ServedModel.objects.filter(pk=served_model.pk).exists()
    assert 'id="notice">Model tiny deleted.</p>' in admin_client.get("/models/").content.decode()


def test_a_viewer_is_refused_every_action(viewer_client: Client, deployment: Deployment, host: Host) -> None:
    model_pk = deployment.model_id
    for path, data in [
        (f"/models/{model_pk}/deploy/", {"host": host.name, "gpus": "1"}),
        (f"/deployments/{deployment.pk}/stop/", {}),
        (f"/deployments/{deployment.pk}/start/", {}),
        (f"/deployments/{deployment.pk}/delete/", {}),
        (f"/models/{model_pk}/delete/", {}),
    ]:
        assert viewer_client.post(path, data).status_code == 403, path
    deployment.refresh_from_db()
    assert deployment.desired_state == DesiredState.RUNNING
    assert list(Deployment.objects.values_list("pk", flat=True)) == [deployment.pk]
    assert ServedModel.objects.filter(pk=model_pk).exists()


def test_the_actions_answer_posts_only(admin_client: Client, deployment: Deployment) -> None:
    for path in (
        f"/models/{deployment.model_id}/deploy/",
        f"/models/{deployment.model_id}/delete/",
        f"/deployments/{deployment.pk}/stop/",
        f"/deployments/{deployment.pk}/delete/",
    ):
        assert admin_client.get(path).status_code == 405, path
    assert Deployment.objects.filter(pk=deployment.pk, desired_state=DesiredState.RUNNING).exists()


def test_the_dashboard_and_the_api_refuse_a_running_deployments_delete_alike(
    admin_client: Client, admin_user: Any, deployment: Deployment
) -> None:
    api = APIClient()
    api.force_authenticate(admin_user)
    refused_by_api = api.delete(f"/api/v1/deployments/{deployment.pk}/")
    refused_on_page = admin_client.post(f"/deployments/{deployment.pk}/delete/")

    assert (refused_by_api.status_code, refused_on_page.status_code) == (409, 409)
    assert f'id="refusal">{refused_by_api.json()["detail"]}</p>' in refused_on_page.content.decode()
    assert Deployment.objects.filter(pk=deployment.pk, desired_state=DesiredState.RUNNING).exists()
