"""Registry operations beyond plain CRUD."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployments.services import await_model_restart, engine_settings
from django.db import transaction
from django.db.models import QuerySet

from registry.models import ServedModel


def served_models() -> QuerySet[ServedModel]:
    """All served models in a stable order (by name, unique)."""
    return ServedModel.objects.order_by("name")


@transaction.atomic
def update_served_model(model: ServedModel, changes: Mapping[str, Any]) -> ServedModel:
    """Set ``changes`` (validated field values) on ``model`` and save it.

    The other fields are re-read under the row lock first, so that an edit does not write back a
    stale copy of another edit's values. An edit of the settings the agents run engines with
    (`deployments.services.ENGINE_SETTINGS`) makes them restart the model's engines: its running
    deployments are pending until their agent reports the restart, in this same transaction
    (`deployments.services.await_model_restart`, which locks them before the save, see there).

    The row lock is ``FOR NO KEY UPDATE``: it keeps other edits out but not the foreign-key check
    of a deployment of the model being created meanwhile (by a plan apply holding the hosts).

    Raises:
        PlacementError: ``changes`` change the tensor-parallel size while deployments of the model
            run (`deployments.services.check_tensor_parallel_change`, checked under the locks);
            nothing is saved.
        ServedModel.DoesNotExist: the model was deleted since ``model`` was read; nothing is saved
            (the API answers 404, as for a model that never was)."""
    ServedModel.objects.select_for_update(no_key=True).filter(pk=model.pk).first()
    model.refresh_from_db()
    before = engine_settings(model)
    for name, value in changes.items():
        setattr(model, name, value)
    await_model_restart(model, before)
    model.save()
    return model
