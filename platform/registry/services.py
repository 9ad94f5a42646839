"""Registry operations beyond plain CRUD."""

from __future__ import annotations

from django.db.models import QuerySet

from registry.models import ServedModel


def served_models() -> QuerySet[ServedModel]:
    """All served models in a stable order (by name, unique)."""
    return ServedModel.objects.order_by("name")
