"""The Django admin's deployment pages follow the API's and the dashboard's rules: a deployment
meant to run is not deleted (the same message), alone or among others selected; a Start on devices
another running deployment took is refused with the placement message, not a server error."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import Role, User
from deployments import admin as deployment_admin
from deployments.models import Deployment, DesiredState
from deployments.services import DeploymentRunning, delete_stopped_deployments
from django.test import Client
from inventory.models import Device, Host
from registry.models import ServedModel

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/deployments/deployment/"


@pytest.fixture
def root_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-pw-9f2k", role=Role.ADMIN))
    return client


def _deployments(*states: DesiredState) -> list[Deployment]:
    host = Host.objects.create(name="host-a")
    model = ServedModel.objects.create(
        name="tiny",
        source="/models/tiny",
        tensor_parallel_size=1,
        max_context_length=256,
        slo_ttft_p99_ms=500.0,
        slo_tbt_p99_ms=50.0,
    )
    made = []
    for index, state in enumerate(states):
        device = Device.objects.create(
            host=host, index=index, uuid=f"GPU-{index}", name="L4", memory_total_bytes=24 << 30
        )
        deployment = Deployment.objects.create(model=model, host=host, desired_state=state)
        deployment.devices.set([device])
        made.append(deployment)
    return made


def _message(deployment: Deployment) -> str:
    return f"Deployment {deployment.pk} is meant to run: stop it before deleting it."


def test_it_refuses_to_delete_a_running_deployment(root_client: Client) -> None:
    (running,) = _deployments(DesiredState.RUNNING)
    url = f"{CHANGELIST}{running.pk}/delete/"

    for response in (root_client.get(url, follow=True), root_client.post(url, {"post": "yes"}, follow=True)):
        assert response.redirect_chain[-1][0] == f"{CHANGELIST}{running.pk}/change/"
        assert _message(running) in response.content.decode()
    running.refresh_from_db()
    assert running.desired_state == DesiredState.RUNNING


def test_it_deletes_a_stopped_deployment(root_client: Client) -> None:
    (stopped,) = _deployments(DesiredState.STOPPED)
    response = root_client.post(f"{CHANGELIST}{stopped.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Deployment.objects.exists()


def test_a_bulk_delete_with_a_running_deployment_deletes_none(root_client: Client) -> None:
    stopped, running = _deployments(DesiredState.STOPPED, DesiredState.RUNNING)
    selected = {"action": "delete_selected", "_selected_action": [stopped.pk, running.pk], "post": "yes"}

    response = root_client.post(CHANGELIST, selected, follow=True)

    assert _message(running) in response.content.decode()
    assert sorted(Deployment.objects.values_list("pk", flat=True)) == [stopped.pk, running.pk]


def test_a_bulk_delete_of_stopped_deployments_deletes_them(root_client: Client) -> None:
    first, second = _deployments(DesiredState.STOPPED, DesiredState.STOPPED)
    selected = {"action": "delete_selected", "_selected_action": [first.pk, second.pk], "post": "yes"}
    assert root_client.post(CHANGELIST, selected).status_code == 302
    assert not Deployment.objects.exists()


def test_a_deployment_started_after_the_confirmation_is_not_deleted(root_client: Client) -> None:
    (deployment,) = _deployments(DesiredState.STOPPED)
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.RUNNING)  # a Start since
    with pytest.raises(DeploymentRunning, match=_message(deployment)):
        delete_stopped_deployments([deployment.pk])
    assert Deployment.objects.filter(pk=deployment.pk).exists()


def _taken(*, started_since: bool) -> tuple[Deployment, Deployment]:
    """A stopped deployment and a running one on the same device (the stopped one's, taken since)."""
    stopped, other = _deployments(DesiredState.STOPPED, DesiredState.STOPPED)
    other.devices.set(list(stopped.devices.all()))
    if not started_since:
        Deployment.objects.filter(pk=other.pk).update(desired_state=DesiredState.RUNNING)
    return stopped, other


def test_a_start_on_devices_another_deployment_took_is_a_form_error(root_client: Client) -> None:
    stopped, other = _taken(started_since=False)

    response = root_client.post(f"{CHANGELIST}{stopped.pk}/change/", {"desired_state": "running"})

    assert response.status_code == 200
    assert f"Devices already used by: deployment {other.pk} ({other})." in response.content.decode()
    stopped.refresh_from_db()
    assert stopped.desired_state == DesiredState.STOPPED


def test_a_start_refused_under_the_locks_changes_nothing(
    root_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped, other = _taken(started_since=True)
    url = f"{CHANGELIST}{stopped.pk}/change/"
    started = deployment_admin.check_placement

    def other_started_meanwhile(*args: Any, **kwargs: Any) -> None:  # after the form's check
        started(*args, **kwargs)
        Deployment.objects.filter(pk=other.pk).update(desired_state=DesiredState.RUNNING)

    monkeypatch.setattr(deployment_admin, "check_placement", other_started_meanwhile)

    response = root_client.post(url, {"desired_state": "running"}, follow=True)

    assert response.redirect_chain == [(url, 302)]
    assert (
        f"Not saved: Devices already used by: deployment {other.pk} ({other})." in response.content.decode()
    )
    stopped.refresh_from_db()
    assert stopped.desired_state == DesiredState.STOPPED
