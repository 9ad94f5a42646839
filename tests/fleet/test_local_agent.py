"""`manage.py local_agent`: the host, token and tiny-model deployment `make run` starts an agent with.

`make run` runs it on every start: it must not fail, nor undo what an operator changed since (the
tiny model's settings, its deployment stopped, the device given to another model)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from agents.models import DemoModelSeed
from agents.services import LinkedHost, desired_deployments
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import create_deployment, report_observed_state, update_deployment
from django.core.management import CommandError, call_command
from inventory.models import Device, DeviceKind, Host
from inventory.services import authenticate_agent
from registry.models import ServedModel
from registry.services import update_served_model

from gpu_agent.engines.command import AQUA_SCHEDULER, VllmLauncher

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("local_agent", *args, stdout=out)
    return out.getvalue().strip()


def test_it_rotates_the_token_and_deploys_the_tiny_model_once(tmp_path: Path) -> None:
    first = run("local", "--tiny-model", str(tmp_path))
    second = run("local", "--tiny-model", str(tmp_path))
    host = Host.objects.get(name="local")
    assert authenticate_agent(second) == host
    assert authenticate_agent(first) is None  # rotated
    deployment = Deployment.objects.get(host=host)
    assert deployment.model.name == "tiny-llama" and deployment.model.source == str(tmp_path)
    assert [d.index for d in deployment.devices.all()] == [0]


def test_it_prepares_a_simulated_host_without_deployments() -> None:
    token = run("sim-8xh100", "--simulated")
    host = Host.objects.get(name="sim-8xh100")
    assert host.simulated and authenticate_agent(token) == host
    assert not Deployment.objects.exists()


def test_it_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="slug"):
        run("not a slug")
    with pytest.raises(CommandError, match="not a directory"):
        run("local", "--tiny-model", str(tmp_path / "missing"))
    assert not Host.objects.exists()


def run_with_notice(*args: str) -> tuple[str, str]:
    """The command's stdout (the token) and stderr (a line for the operator, or "")."""
    out, err = StringIO(), StringIO()
    call_command("local_agent", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue().strip()


def another_model(name: str = "my-tiny") -> ServedModel:
    return ServedModel.objects.create(
        name=name, source="/models/mine", max_context_length=256, slo_ttft_p99_ms=1.0, slo_tbt_p99_ms=1.0
    )


def test_a_stopped_tiny_deployment_stays_stopped_while_another_model_holds_the_device(tmp_path: Path) -> None:
    """The audited `make run`: the operator stopped tiny-llama and deployed another model on the
    host's only device; the next run failed with a PlacementError and started nothing."""
    run("local", "--tiny-model", str(tmp_path))
    tiny = Deployment.objects.get()
    update_deployment(tiny, desired_state=DesiredState.STOPPED)
    mine = create_deployment(another_model(), tiny.host, list(tiny.devices.all()))

    token, notice = run_with_notice("local", "--tiny-model", str(tmp_path))

    assert authenticate_agent(token) == tiny.host
    assert sorted(Deployment.objects.values_list("pk", "desired_state")) == [
        (tiny.pk, DesiredState.STOPPED),
        (mine.pk, DesiredState.RUNNING),
    ]
    assert notice.startswith(f"tiny-llama@local (deployment {tiny.pk}) is stopped and stays so")
    assert f"PATCH /api/v1/deployments/{tiny.pk}/" in notice and "\n" not in notice


def test_a_tiny_deployment_keeps_its_desired_state_running_or_stopped(tmp_path: Path) -> None:
    run("local", "--tiny-model", str(tmp_path))
    _, notice = run_with_notice("local", "--tiny-model", str(tmp_path))
    tiny = Deployment.objects.get()
    assert tiny.desired_state == DesiredState.RUNNING and notice == ""
    update_deployment(tiny, desired_state=DesiredState.STOPPED)  # the device is free now
    _, notice = run_with_notice("local", "--tiny-model", str(tmp_path))
    assert list(Deployment.objects.values_list("pk", "desired_state")) == [(tiny.pk, DesiredState.STOPPED)]
    assert "is stopped and stays so" in notice


def test_the_tiny_model_is_registered_but_not_deployed_when_another_deployment_holds_the_device(
    tmp_path: Path,
) -> None:
    run("local")
    host = Host.objects.get(name="local")
    device = Device.objects.create(
        host=host, index=0, uuid="cpu-local", name="CPU", kind=DeviceKind.CPU, memory_total_bytes=1 << 30
    )
    mine = create_deployment(another_model(), host, [device])

    token, notice = run_with_notice("local", "--tiny-model", str(tmp_path))

    assert authenticate_agent(token) == host
    assert ServedModel.objects.filter(name="tiny-llama").exists()
    assert list(Deployment.objects.all()) == [mine]
    assert notice == (
        "tiny-llama is registered but not deployed on local: Devices already used by: "
        f"deployment {mine.pk} (my-tiny@local). "
        "To deploy it once the device is free: POST /api/v1/deployments/ "
        f'{{"model": "tiny-llama", "host": "local", "devices": [{device.pk}]}}'
    )


def test_an_operators_edits_of_the_tiny_model_survive_a_restart(tmp_path: Path) -> None:
    run("local", "--tiny-model", str(tmp_path))
    model = ServedModel.objects.get(name="tiny-llama")
    edits = {
        "engine_options": {"seed": 7, "max_num_seqs": 4},
        "slo_ttft_p99_ms": 900.0,
        "slo_tbt_p99_ms": 90.0,
        "slo_attainment_pct": 99.0,
        "max_context_length": 128,
    }
    update_served_model(model, edits)

    run("local", "--tiny-model", str(tmp_path))

    model.refresh_from_db()
    assert {name: getattr(model, name) for name in edits} == edits
    assert model.source == str(tmp_path)


def test_a_moved_tiny_model_updates_only_its_source_and_restarts_its_engine(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    run("local", "--tiny-model", str(old))
    model = ServedModel.objects.get(name="tiny-llama")
    update_served_model(model, {"slo_ttft_p99_ms": 900.0})
    deployment = report_observed_state(Deployment.objects.get(), ObservedState.RUNNING)

    run("local", "--tiny-model", str(new))

    model.refresh_from_db()
    assert (model.source, model.slo_ttft_p99_ms) == (str(new), 900.0)
    deployment.refresh_from_db()
    # Through the registry's edit: the agent restarts the engine, and the deployment waits for it.
    assert deployment.observed_state == ObservedState.PENDING
    assert "model settings changed (source)" in deployment.observed_message


def test_the_tiny_model_runs_with_the_aqua_scheduler_and_kv_connector(tmp_path: Path) -> None:
    run("local", "--tiny-model", str(tmp_path))
    model = ServedModel.objects.get(name="tiny-llama")
    model.full_clean()  # the engine options are ones the registry accepts
    deployment = Deployment.objects.get()
    host = deployment.host
    linked = LinkedHost(host.pk, host.name, host.address, host.simulated, device_ids={})
    (spec,) = desired_deployments(linked).deployments  # what the agent is sent
    argv = VllmLauncher("cpu", aqua_socket=str(tmp_path / "aqua.sock"))(spec, 8001).argv
    assert argv[argv.index("--scheduler-cls") + 1] == AQUA_SCHEDULER
    connector = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert connector["kv_connector_extra_config"]["consumer_id"] == str(deployment.pk)


def test_a_renamed_tiny_model_is_not_seeded_again(tmp_path: Path) -> None:
    """The audited restart: tiny-llama renamed tiny2 (PATCH /api/v1/models/1/), and the next
    `make run` registered a second tiny-llama of the same source, undeployed, with a notice."""
    run("local", "--tiny-model", str(tmp_path))
    tiny = Deployment.objects.get()
    update_served_model(tiny.model, {"name": "tiny2"})

    _, notice = run_with_notice("local", "--tiny-model", str(tmp_path))

    assert list(ServedModel.objects.values_list("pk", "name")) == [(tiny.model.pk, "tiny2")]
    assert list(Deployment.objects.values_list("pk", "desired_state")) == [(tiny.pk, DesiredState.RUNNING)]
    assert notice == ""


def test_a_deleted_tiny_model_is_not_seeded_again(tmp_path: Path) -> None:
    run("local", "--tiny-model", str(tmp_path))
    tiny = Deployment.objects.get()
    tiny.delete()
    tiny.model.delete()

    token, notice = run_with_notice("local", "--tiny-model", str(tmp_path))

    assert authenticate_agent(token) == tiny.host
    assert not ServedModel.objects.exists() and not Deployment.objects.exists()
    assert notice == ""


def test_a_tiny_model_seeded_and_renamed_before_the_seed_was_remembered_is_adopted(tmp_path: Path) -> None:
    """A database from before `DemoModelSeed`: the model of the bundled source is the seeded one."""
    run("local", "--tiny-model", str(tmp_path))
    DemoModelSeed.objects.all().delete()
    tiny = Deployment.objects.get()
    update_served_model(tiny.model, {"name": "tiny2"})

    run("local", "--tiny-model", str(tmp_path))

    assert list(ServedModel.objects.values_list("pk", "name")) == [(tiny.model.pk, "tiny2")]
    assert DemoModelSeed.objects.get().model == tiny.model
    assert list(Deployment.objects.all()) == [tiny]
