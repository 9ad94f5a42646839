"""Registry operations beyond plain CRUD."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from registry.models import ServedModel


class ModelInUse(Exception):
    """The model cannot be deleted; the message says what still refers to it."""


def served_models() -> QuerySet[ServedModel]:
    """All served models in a stable order (by name, unique)."""
    return ServedModel.objects.order_by("name")


@transaction.atomic
def delete_served_model(model: ServedModel) -> None:
    """Delete the model with its profile and latency samples; its usage rows (billing history) stay,
    under its name.

    Raises:
        ModelInUse: deployments still use it.
    """
    deployments = sorted(model.deployments.values_list("pk", flat=True))
    if deployments:
        ids = ", ".join(str(pk) for pk in deployments)
        raise ModelInUse(f"Cannot delete: still referred to by deployments {ids}. Delete those first.")
    model.delete()
