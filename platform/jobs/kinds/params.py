"""Base class for job parameter serializers, and bounds shared by several kinds."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

# Burst levels (x a model's max rate) that profiles are sized for and placements use.
MAX_BURST_LEVEL = 64.0

# DRF's FloatField takes true/false as 1.0/0.0; for a job parameter that is a wrong type.
_NUMBER_FIELDS = (serializers.FloatField, serializers.IntegerField, serializers.DecimalField)  # noqa: TID251


class StrictParams(serializers.Serializer):
    """Parameters of a job kind: unknown keys and booleans given for numbers are errors, not
    silently dropped or converted."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Parameters must be a JSON object."]})
        errors: dict[str, list[str]] = {key: ["Unknown parameter."] for key in data if key not in self.fields}
        for name, field in self.fields.items():
            if _has_boolean_number(field, data.get(name)):
                errors[name] = ["A number is required, not a boolean."]
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:  # report every error at once
            detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
            raise serializers.ValidationError({**detail, **errors}) from None
        if errors:
            raise serializers.ValidationError(errors)
        return value


def _has_boolean_number(field: serializers.Field, value: Any) -> bool:
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        return any(_has_boolean_number(field.child, item) for item in value)
    return isinstance(field, _NUMBER_FIELDS) and isinstance(value, bool)
