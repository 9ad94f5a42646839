"""A model edit racing a plan apply of the model's deployments, on PostgreSQL's row locks.

The apply holds every host, then writes deployments one by one, and may insert a deployment of
the model, whose foreign-key check locks the model row FOR KEY SHARE. The edit holds the model
row and locks the model's deployments. Taken in the order every deployment writer takes them
(the hosts, then the deployment rows; the model row FOR NO KEY UPDATE, and saved last), the two
run one after the other instead of PostgreSQL aborting one with "deadlock detected"."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from deployments.models import Deployment, DesiredState
from deployments.services import create_deployment, update_deployment
from django.db import connection, transaction
from inventory.models import Device, Host
from inventory.services import register_host
from planning.applying import _lock_hosts
from registry.models import ServedModel
from registry.services import update_served_model

from tests.pg_locks import backend_pid, wait_until_blocked

from .conftest import AgentHost
from .test_model_edit_restart import running
from .test_reconcile_audit import register

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]

# An engine setting, and a rename too: its save takes FOR UPDATE on the model row (the name is a
# unique key), which blocks a foreign-key check.
EDITS = [{"dtype": "float16"}, {"name": "tiny-v2"}]


def race(
    model: ServedModel, change: dict[str, Any], first: Callable[[], Any], then: Callable[[], Any]
) -> None:
    """Run an apply that locks every host and does ``first``, then, once the edit of ``model``
    with ``change`` waits for one of its locks, ``then``; assert that both committed."""
    editor_pid: list[int] = []
    editor_connected, apply_did_first = threading.Event(), threading.Event()
    errors: list[str] = []

    def apply() -> None:
        try:
            with transaction.atomic():
                _lock_hosts()  # as planning.applying.apply_plan does
                first()
                apply_did_first.set()
                wait_until_blocked(editor_pid[0])
                then()
        except Exception as exc:
            errors.append(f"apply: {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    def edit() -> None:
        try:
            editor_pid.append(backend_pid())
            editor_connected.set()
            assert apply_did_first.wait(10)
            update_served_model(ServedModel.objects.get(pk=model.pk), change)
        except Exception as exc:
            errors.append(f"edit: {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    editor, applier = threading.Thread(target=edit), threading.Thread(target=apply)
    editor.start()
    assert editor_connected.wait(10)
    applier.start()
    for thread in (editor, applier):
        thread.join(timeout=30)
    assert not editor.is_alive() and not applier.is_alive()
    assert errors == []
    field, value = next(iter(change.items()))
    assert getattr(ServedModel.objects.get(pk=model.pk), field) == value


def stop(deployment: Deployment) -> None:
    update_deployment(Deployment.objects.get(pk=deployment.pk), desired_state=DesiredState.STOPPED)


def states(model: ServedModel) -> list[tuple[int, str]]:
    return [(d.host_id, d.desired_state) for d in Deployment.objects.filter(model=model).order_by("pk")]


@pytest.mark.parametrize("change", EDITS, ids=lambda c: next(iter(c)))
def test_it_runs_an_edit_and_an_apply_moving_the_model_to_another_host_one_after_the_other(
    agent_host: AgentHost, served_model: ServedModel, change: dict[str, Any]
) -> None:
    other = register_host("gpu-b", "10.0.0.6")
    register(other)
    _, (moved,) = running(served_model, agent_host, 0)

    def start_on_other() -> None:
        model, host = ServedModel.objects.get(pk=served_model.pk), Host.objects.get(pk=other.pk)
        create_deployment(model, host, [Device.objects.get(host=other, index=0)])

    race(served_model, change, lambda: stop(moved), start_on_other)
    assert states(served_model) == [
        (agent_host.host.pk, DesiredState.STOPPED),
        (other.pk, DesiredState.RUNNING),
    ]


@pytest.mark.parametrize("change", EDITS, ids=lambda c: next(iter(c)))
def test_it_runs_an_edit_and_an_apply_stopping_the_models_deployments_one_after_the_other(
    agent_host: AgentHost, served_model: ServedModel, change: dict[str, Any]
) -> None:
    """An apply stops a second running deployment of a planned model before it moves the first:
    it writes the model's deployments out of pk order, which only the hosts' locks serialise."""
    other = register_host("gpu-b", "10.0.0.6")
    register(other)
    _, (first,) = running(served_model, agent_host, 0)
    _, (second,) = running(served_model, AgentHost(other, ""), 0)
    race(served_model, change, lambda: stop(second), lambda: stop(first))
    assert states(served_model) == [
        (agent_host.host.pk, DesiredState.STOPPED),
        (other.pk, DesiredState.STOPPED),
    ]
