"""Serializer base classes shared by the apps."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictModelSerializer(serializers.ModelSerializer):
    """A ModelSerializer that rejects keys it would otherwise ignore.

    DRF silently drops unknown and read-only keys, so a typo (``tensor_paralel_size``) or an
    attempt to set ``status`` would succeed while doing something else than asked. Here each such
    key is a field error, so the request fails with 400 and nothing is written.
    """

    def to_internal_value(self, data: Any) -> Any:
        errors: dict[str, list[str]] = {}
        if isinstance(data, dict):
            for key in data:
                field = self.fields.get(key)
                if field is None:
                    errors[key] = ["Unknown field."]
                elif field.read_only:
                    errors[key] = ["This field is read-only."]
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if errors and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **errors}) from exc
            raise
        if errors:
            raise serializers.ValidationError(errors)
        return value


class NameRelatedField(serializers.SlugRelatedField):
    """A row given by its name (``slug_field``). A name holding a NUL character is a 400 like
    DRF's CharField gives: PostgreSQL text cannot hold NUL, so looking such a name up would raise
    DataError (a 500) rather than find nothing."""

    default_error_messages = {"null_characters": "Null characters are not allowed."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("null_characters")
        return super().to_internal_value(data)
