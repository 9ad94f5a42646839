from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from deployments.services import PlacementError, check_tensor_parallel_change
from django.db import IntegrityError, transaction
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

from core.serializers import StrictModelSerializer
from registry.models import ServedModel
from registry.services import update_served_model
from registry.validators import validate_engine_options


def name_taken(name: str) -> str:
    """The error for a model name another model has (DRF's default read "served model with this
    name already exists.")."""
    return f"A model named {name!r} already exists; choose another name."


class _UniqueName(UniqueValidator):
    """DRF's unique check of ``name``, whose error names the name (`name_taken`)."""

    def __call__(self, value: Any, serializer_field: Any) -> None:
        try:
            super().__call__(value, serializer_field)
        except serializers.ValidationError:
            raise serializers.ValidationError(name_taken(value), code="unique") from None


class ServedModelSerializer(StrictModelSerializer):
    """A served model. Unknown fields, non-power-of-two TP sizes and non-positive SLOs are 400s;
    a name another model has is a 400 naming it (`name_taken`)."""

    engine_options = serializers.JSONField(required=False, validators=[validate_engine_options])

    class Meta:
        model = ServedModel
        fields = [
            "id",
            "name",
            "source",
            "dtype",
            "tensor_parallel_size",
            "max_context_length",
            "slo_ttft_p99_ms",
            "slo_tbt_p99_ms",
            "slo_attainment_pct",
            "engine_options",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        name = fields["name"]
        name.validators = [
            _UniqueName(queryset=v.queryset) if type(v) is UniqueValidator else v for v in name.validators
        ]
        return fields

    def create(self, validated_data: dict[str, Any]) -> ServedModel:
        with _name_race_as_400(validated_data["name"]):
            return super().create(validated_data)

    def update(self, instance: ServedModel, validated_data: dict[str, Any]) -> ServedModel:
        with _name_race_as_400(validated_data.get("name", instance.name)):
            try:
                return update_served_model(instance, validated_data)
            except PlacementError as exc:
                raise serializers.ValidationError({exc.field: [str(exc)]}) from exc

    def validate_tensor_parallel_size(self, value: int) -> int:
        """No size change while deployments of the model run (`check_tensor_parallel_change`):
        answered here next to the other field errors, and checked again by `update_served_model`
        under its locks, where a deployment started since cannot slip through."""
        instance = self.instance
        if isinstance(instance, ServedModel):
            try:
                check_tensor_parallel_change(instance, instance.tensor_parallel_size, value)
            except PlacementError as exc:
                raise serializers.ValidationError(str(exc)) from exc
        return value

    def validate_source(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Give a local path or a hub id (org/name).")
        return value.strip()


@contextmanager
def _name_race_as_400(name: str) -> Iterator[None]:
    """Two requests creating the same name at once: the loser gets the same 400 as a plain duplicate."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as exc:
        if "name" not in str(exc):  # a unique-name violation on SQLite and PostgreSQL alike
            raise
        raise serializers.ValidationError({"name": [name_taken(name)]}) from exc
