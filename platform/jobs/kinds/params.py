"""Base class for job parameter serializers."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictParams(serializers.Serializer):
    """Parameters of a job kind: unknown keys are errors, not silently dropped."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Parameters must be a JSON object."]})
        unknown = {key: ["Unknown parameter."] for key in data if key not in self.fields}
        value = super().to_internal_value(data)
        if unknown:
            raise serializers.ValidationError(unknown)
        return value
