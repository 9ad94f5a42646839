"""Edits of a served model while its engines run: an edit of what the agent runs an engine with
makes the agents restart it, so the model's deployments are pending until the agent reports the
restart (the old engine's `running` is not the new spec's); other edits change nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from accounts.models import Role, User
from accounts.services import issue_api_token
from agents import services
from agents.models import Replica
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import ENGINE_SETTINGS, PlacementError, create_deployment, update_deployment
from django.contrib.admin.models import LogEntry
from django.db import connection, transaction
from gateway.services import healthy_targets
from inventory.models import Device
from registry import services as registry_services
from registry.api.serializers import ServedModelSerializer
from registry.models import ServedModel
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from .conftest import AgentHost
from .test_reconcile_audit import deploy, observed, register, status

pytestmark = pytest.mark.django_db(transaction=True)

ENGINE_EDITS = [
    {"engine_options": {"seed": 1}},
    {"max_context_length": 512},
    {"dtype": "bfloat16"},
    {"source": "/models/tiny-v2"},
    {"name": "tiny-v2"},
]


@pytest.fixture
def admin_client(transactional_db: None) -> APIClient:
    user = User.objects.create_user(username="alice", password="alice-pw-9f2k", role=Role.ADMIN)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user, 'test').plaintext}")
    return client


def edit(client: APIClient, model: ServedModel, change: dict[str, Any]) -> None:
    response = client.patch(f"/api/v1/models/{model.pk}/", change, format="json")
    assert response.status_code == 200, response.data


def running(
    model: ServedModel, host: AgentHost, *indices: int
) -> tuple[services.LinkedHost, list[Deployment]]:
    """Deployments of ``model`` on ``indices``, each reported running by the host's agent."""
    linked = register(host.host)
    deployments = [deploy(model, host.host, i) for i in indices]
    for port, deployment in enumerate(deployments, start=8100):
        services.report_status(linked, status(deployment, "running", time.time(), port=port))
    return linked, deployments


@pytest.mark.parametrize("change", ENGINE_EDITS, ids=lambda change: next(iter(change)))
def test_an_edit_of_the_engine_settings_is_not_running_until_the_agent_restarts_the_engines(
    agent_host: AgentHost, served_model: ServedModel, admin_client: APIClient, change: dict[str, Any]
) -> None:
    linked, deployments = running(served_model, agent_host, 0, 1)
    edit(admin_client, served_model, change)
    field = next(iter(change))
    for deployment in deployments:
        assert observed(deployment) == ObservedState.PENDING
        assert f"model settings changed ({field})" in deployment.observed_message
    assert healthy_targets(served_model) == []
    # The old engines' `running`, re-sent after a reconnect or in flight, is not the new spec's.
    for deployment in deployments:
        services.report_status(linked, status(deployment, "running", time.time(), port=8100))
        assert observed(deployment) == ObservedState.PENDING
    # The agent stops the old engine and starts the new one.
    first = deployments[0]
    for state, port in (("stopped", None), ("starting", 8102), ("running", 8102)):
        services.report_status(linked, status(first, state, time.time(), port=port))
        assert observed(first) == state
    assert Replica.objects.get(deployment=first).base_url == "http://10.0.0.5:8102"
    assert [t.deployment_id for t in healthy_targets(served_model)] == [first.pk]
    assert observed(deployments[1]) == ObservedState.PENDING


def test_an_edit_of_the_slos_only_leaves_the_engines_running(
    agent_host: AgentHost, served_model: ServedModel, admin_client: APIClient
) -> None:
    _, deployments = running(served_model, agent_host, 0)
    edit(admin_client, served_model, {"slo_ttft_p99_ms": 250.0, "slo_attainment_pct": 99.0})
    edit(admin_client, served_model, {"engine_options": {"seed": 0}})  # the same value again
    assert observed(deployments[0]) == ObservedState.RUNNING
    assert [t.deployment_id for t in healthy_targets(served_model)] == [deployments[0].pk]


def test_a_model_edit_undone_before_the_agent_acted_leaves_the_old_engines_running(
    agent_host: AgentHost, served_model: ServedModel, admin_client: APIClient
) -> None:
    """The agent restarts only an engine whose spec changed: back to the old settings, nothing
    will report, so the old engine's state must come back."""
    _, deployments = running(served_model, agent_host, 0, 1)
    edit(admin_client, served_model, {"engine_options": {"seed": 1}, "max_context_length": 512})
    edit(admin_client, served_model, {"max_context_length": 256})
    assert observed(deployments[0]) == ObservedState.PENDING  # engine_options still differ
    edit(admin_client, served_model, {"engine_options": {"seed": 0}})
    assert [observed(d) for d in deployments] == [ObservedState.RUNNING] * 2
    assert [t.deployment_id for t in healthy_targets(served_model)] == [d.pk for d in deployments]


def test_a_device_edit_and_a_model_edit_await_one_restart_and_are_undone_together(
    agent_host: AgentHost, served_model: ServedModel, admin_client: APIClient
) -> None:
    _, (deployment,) = running(served_model, agent_host, 0)
    d0, d1 = Device.objects.filter(host=agent_host.host).order_by("index")
    update_deployment(deployment, devices=[d1])
    edit(admin_client, served_model, {"engine_options": {"seed": 1}})
    update_deployment(deployment, devices=[d0])
    assert observed(deployment) == ObservedState.PENDING
    assert deployment.observed_message.startswith("model settings changed (engine_options)")
    edit(admin_client, served_model, {"engine_options": {"seed": 0}})
    assert observed(deployment) == ObservedState.RUNNING


def test_a_device_edit_names_the_gpu_indices_it_waits_for_not_device_ids(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """The message named indices as "devices", beside the API's `devices`, which are ids."""
    _, (deployment,) = running(served_model, agent_host, 0)
    d0, d1 = Device.objects.filter(host=agent_host.host).order_by("index")
    update_deployment(deployment, devices=[d1])
    assert observed(deployment) == ObservedState.PENDING
    assert deployment.observed_message == (
        f"GPU indices changed from [{d0.index}] to [{d1.index}]; waiting for the agent to restart"
    )


def test_engine_settings_are_the_model_fields_the_agent_is_sent(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """A field that changes the desired spec but is not in ENGINE_SETTINGS would restart engines
    unguarded; one in it that does not would mark deployments pending that nothing ends."""
    linked, _ = running(served_model, agent_host, 0)
    new_values = {
        "name": "tiny-v2",
        "source": "/models/tiny-v2",
        "dtype": "bfloat16",
        "tensor_parallel_size": 2,
        "max_context_length": 512,
        "engine_options": {"seed": 1},
        "slo_ttft_p99_ms": 250.0,
        "slo_tbt_p99_ms": 25.0,
        "slo_attainment_pct": 99.0,
    }
    fields = {f.name for f in ServedModel._meta.concrete_fields} - {"id", "created_at", "updated_at"}
    assert fields == set(new_values), "classify the new field here"
    spec = services.desired_deployments(linked).deployments[0]
    for name, value in new_values.items():
        model = ServedModel.objects.get(pk=served_model.pk)
        setattr(model, name, value)
        model.save()
        assert (services.desired_deployments(linked).deployments[0] != spec) == (name in ENGINE_SETTINGS), (
            name
        )
        ServedModel.objects.filter(pk=served_model.pk).update(**{name: getattr(served_model, name)})


def test_an_edit_whose_deployments_cannot_be_marked_is_not_stored(
    agent_host: AgentHost, served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edit and the deployments' wait are one transaction: the agent never gets a new spec
    whose deployments still claim the old engine's `running`."""
    running(served_model, agent_host, 0)

    def fail(model: ServedModel, before: dict[str, Any]) -> list[int]:
        raise RuntimeError("database gone")

    monkeypatch.setattr(registry_services, "await_model_restart", fail)
    with pytest.raises(RuntimeError):
        registry_services.update_served_model(served_model, {"engine_options": {"seed": 1}})
    assert ServedModel.objects.get(pk=served_model.pk).engine_options == {"seed": 0}


def test_an_edit_in_the_admin_is_guarded_like_one_through_the_api(
    agent_host: AgentHost, served_model: ServedModel, client: Any
) -> None:
    _, deployments = running(served_model, agent_host, 0)
    admin = User.objects.create_superuser(username="root", password="root-pw-7d1x")
    client.force_login(admin)
    url = f"/admin/registry/servedmodel/{served_model.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data = {k: ("" if v is None else v) for k, v in data.items()}
    data["engine_options"] = '{"seed": 3}'
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    served_model.refresh_from_db()
    assert served_model.engine_options == {"seed": 3}
    assert observed(deployments[0]) == ObservedState.PENDING


def test_a_device_edit_pending_from_before_model_edits_were_guarded_still_awaits_a_model_edit(
    agent_host: AgentHost, served_model: ServedModel, admin_client: APIClient
) -> None:
    """A wait kept by an older version has no "model": the engine it waits for runs the settings
    from before the first model edit to meet it, not the edited ones."""
    _, (deployment,) = running(served_model, agent_host, 0)
    d0, d1 = Device.objects.filter(host=agent_host.host).order_by("index")
    update_deployment(deployment, devices=[d1])
    deployment.refresh_from_db()
    assert deployment.restart_from is not None and deployment.restart_from["devices"] == [0]
    legacy = {k: v for k, v in deployment.restart_from.items() if k != "model"}
    Deployment.objects.filter(pk=deployment.pk).update(restart_from=legacy)
    edit(admin_client, served_model, {"engine_options": {"seed": 1}})
    deployment.refresh_from_db()
    assert deployment.restart_from is not None
    assert deployment.restart_from["model"]["engine_options"] == {"seed": 0}
    update_deployment(deployment, devices=[d0])  # the device edit undone: the model edit is not
    assert observed(deployment) == ObservedState.PENDING
    assert deployment.observed_message.startswith("model settings changed (engine_options)")
    edit(admin_client, served_model, {"engine_options": {"seed": 0}})
    assert observed(deployment) == ObservedState.RUNNING


def admin_form_data(client: Any, model: ServedModel, **changes: Any) -> tuple[str, dict[str, Any]]:
    """The admin change page's URL and its form's current values, with ``changes``."""
    url = f"/admin/registry/servedmodel/{model.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    return url, {**{k: ("" if v is None else v) for k, v in data.items()}, **changes}


def unchanged(model: ServedModel, deployment: Deployment) -> None:
    """``model`` keeps its tensor-parallel size and ``deployment`` runs on, not awaiting a restart."""
    assert ServedModel.objects.get(pk=model.pk).tensor_parallel_size == 1
    deployment.refresh_from_db()
    assert (deployment.observed_state, deployment.restart_from) == (ObservedState.RUNNING, None)
    assert sorted(deployment.devices.values_list("index", flat=True)) == [0]


def test_an_admin_edit_of_the_tensor_parallel_size_is_refused_while_a_deployment_runs(
    agent_host: AgentHost, served_model: ServedModel, client: Any
) -> None:
    _, (deployment,) = running(served_model, agent_host, 0)
    client.force_login(User.objects.create_superuser(username="root", password="root-pw-7d1x"))
    url, data = admin_form_data(client, served_model, tensor_parallel_size=2, max_context_length=512)
    response = client.post(url, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["tensor_parallel_size"]
    assert f"Deployment(s) {deployment.pk} run this model on 1 device(s)" in errors["tensor_parallel_size"][0]
    unchanged(served_model, deployment)
    assert ServedModel.objects.get(pk=served_model.pk).max_context_length == 256


def test_an_admin_edit_racing_a_deployment_start_is_refused_under_the_locks(
    agent_host: AgentHost, served_model: ServedModel, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployment starts after the form's check (here: the form's check is skipped): the
    locked check refuses the edit, the page says why, and nothing of the edit is stored."""
    _, (deployment,) = running(served_model, agent_host, 0)
    client.force_login(User.objects.create_superuser(username="root", password="root-pw-7d1x"))
    url, data = admin_form_data(client, served_model, tensor_parallel_size=2, max_context_length=512)
    monkeypatch.setattr("registry.admin.check_tensor_parallel_change", lambda *args: None)
    response = client.post(url, data, follow=True)
    assert response.redirect_chain == [(url, 302)]
    shown = [str(m) for m in response.context["messages"]]
    assert shown == [
        f"Not saved: Deployment(s) {deployment.pk} run this model on 1 device(s); "
        "stop them before changing its tensor-parallel size to 2."
    ]
    unchanged(served_model, deployment)
    assert ServedModel.objects.get(pk=served_model.pk).max_context_length == 256
    assert not LogEntry.objects.exists()


def test_a_deployment_started_after_the_apis_check_still_refuses_the_size_change(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """The serializer's check ran before the deployment started; the save checks again, locked."""
    serializer = ServedModelSerializer(served_model, data={"tensor_parallel_size": 2}, partial=True)
    assert serializer.is_valid(), serializer.errors
    _, (deployment,) = running(served_model, agent_host, 0)
    with pytest.raises(ValidationError) as refused:
        serializer.save()
    assert isinstance(refused.value.detail, dict)
    assert list(refused.value.detail) == ["tensor_parallel_size"]
    unchanged(served_model, deployment)


def test_the_tensor_parallel_size_changes_while_the_models_deployments_are_stopped(
    agent_host: AgentHost, served_model: ServedModel, admin_client: APIClient
) -> None:
    register(agent_host.host)
    deployment = deploy(served_model, agent_host.host, 0, desired=DesiredState.STOPPED)
    edit(admin_client, served_model, {"tensor_parallel_size": 2})
    assert ServedModel.objects.get(pk=served_model.pk).tensor_parallel_size == 2
    with pytest.raises(PlacementError, match="needs 2 device"):
        update_deployment(Deployment.objects.get(pk=deployment.pk), desired_state=DesiredState.RUNNING)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path")
def test_a_size_change_waits_for_a_deployment_being_created_on_another_host_and_is_refused(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """The deployment's insert is not committed when the edit starts, on a host where the model
    has no deployment: the edit waits for its host, then sees it."""
    from tests.pg_locks import backend_pid, wait_until_blocked

    register(agent_host.host)
    editor_pid: list[int] = []
    editor_connected, created = threading.Event(), threading.Event()
    deployments: list[Deployment] = []
    outcome: list[str] = []

    def create() -> None:
        try:
            with transaction.atomic():  # its host stays locked until this commits
                deployments.append(deploy(served_model, agent_host.host, 0))
                created.set()
                try:
                    wait_until_blocked(editor_pid[0], timeout=3.0)
                except AssertionError:
                    outcome.append("the edit did not wait for the deployment's host")
        finally:
            connection.close()

    def edit_size() -> None:
        try:
            editor_pid.append(backend_pid())
            editor_connected.set()
            assert created.wait(10)
            model = ServedModel.objects.get(pk=served_model.pk)
            registry_services.update_served_model(model, {"tensor_parallel_size": 2})
            outcome.append("saved")
        except PlacementError as exc:
            outcome.append(f"refused: {exc.field}")
        finally:
            connection.close()

    editor, creator = threading.Thread(target=edit_size), threading.Thread(target=create)
    editor.start()
    assert editor_connected.wait(10)
    creator.start()
    for thread in (creator, editor):
        thread.join(timeout=30)
    assert outcome == ["refused: tensor_parallel_size"]
    assert ServedModel.objects.get(pk=served_model.pk).tensor_parallel_size == 1
    assert Deployment.objects.get(pk=deployments[0].pk).desired_state == DesiredState.RUNNING


def test_placement_reads_the_models_size_as_of_now_not_a_stale_copy(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    # A caller's model object loaded before a size edit committed (e.g. a request that waited on
    # the edit's host locks): the deployment must be placed for the size the model has now.
    register(agent_host.host)  # its devices
    stale = ServedModel.objects.get(pk=served_model.pk)
    ServedModel.objects.filter(pk=served_model.pk).update(tensor_parallel_size=2)
    one = list(Device.objects.filter(host=agent_host.host).order_by("index")[:1])
    with pytest.raises(PlacementError, match="needs 2 device"):
        create_deployment(stale, agent_host.host, one)
    two = list(Device.objects.filter(host=agent_host.host).order_by("index")[:2])
    deployment = create_deployment(stale, agent_host.host, two)
    ServedModel.objects.filter(pk=served_model.pk).update(tensor_parallel_size=1)
    with pytest.raises(PlacementError, match="needs 1 device"):
        update_deployment(deployment, desired_state="running")


def test_the_deployment_admin_changes_desired_state_through_the_service_and_adds_nothing(
    agent_host: AgentHost, served_model: ServedModel, client: Any
) -> None:
    _, deployments = running(served_model, agent_host, 0)
    deployment = deployments[0]
    client.force_login(User.objects.create_superuser(username="root", password="root-pw-7d1x"))
    assert client.get("/admin/deployments/deployment/add/").status_code == 403
    url = f"/admin/deployments/deployment/{deployment.pk}/change/"
    form = client.get(url).context["adminform"].form
    assert set(form.fields) == {"desired_state"}, "placement is not editable here"
    response = client.post(url, {"desired_state": "stopped"})
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.desired_state == "stopped"
    # The observed state was re-read and kept, not overwritten from the admin's copy.
    assert deployment.observed_state == ObservedState.RUNNING
