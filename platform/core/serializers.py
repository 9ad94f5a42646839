"""Serializer base classes and number fields shared by the apps.

Numbers given as strings (a form, a query parameter, JSON ``"12"``) take ASCII digits only:
Python's ``int()``, ``float()`` and ``Decimal()`` read any Unicode decimal digit: full-width
``"\\uff11\\uff12"`` or Arabic-Indic ``"\\u0661\\u0662"`` were 12, and a primary key given so
found row 12. `refuse_non_ascii_digits` is the one check: the number fields here
(``IntegerField``, ``FloatField``, ``DecimalField``, ``PrimaryKeyRelatedField``; ruff's banned-api
keeps DRF's own out of the apps), `StrictModelSerializer`'s generated fields, the page
parameters (core/api/pagination.py) and other number parameters call it, and its 400 names the field.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

NON_ASCII_DIGITS = "Only ASCII digits (0-9) are allowed in a number: {char!r} (U+{code:04X}) is not one."


def non_ascii_digits(value: Any) -> str | None:
    """The error for ``value``, a string holding a character other than ASCII, or None."""
    if not isinstance(value, str) or value.isascii():
        return None
    char = next(c for c in value if not c.isascii())
    return NON_ASCII_DIGITS.format(char=char, code=ord(char))


def refuse_non_ascii_digits(value: Any, name: str | None = None) -> None:
    """Raise ValidationError (a 400) when ``value`` is a string that is not all ASCII; with
    ``name`` (a query parameter's), the error is that field's."""
    error = non_ascii_digits(value)
    if error is not None:
        raise serializers.ValidationError({name: [error]} if name else [error], code="non_ascii_digits")


class AsciiDigits(serializers.Field):
    """A field that reads a number (or a primary key) from a string: ASCII digits only."""

    def to_internal_value(self, data: Any) -> Any:
        refuse_non_ascii_digits(data)
        return super().to_internal_value(data)


class IntegerField(AsciiDigits, serializers.IntegerField):  # noqa: TID251
    pass


class BigIntegerField(AsciiDigits, serializers.BigIntegerField):  # noqa: TID251
    pass


class FloatField(AsciiDigits, serializers.FloatField):  # noqa: TID251
    pass


class DecimalField(AsciiDigits, serializers.DecimalField):  # noqa: TID251
    pass


class PrimaryKeyRelatedField(AsciiDigits, serializers.PrimaryKeyRelatedField):  # noqa: TID251
    pass


# DRF's number field -> ours, for the fields a ModelSerializer generates.
_ASCII_NUMBERS: dict[type[serializers.Field], type[serializers.Field]] = {
    serializers.IntegerField: IntegerField,  # noqa: TID251
    serializers.BigIntegerField: BigIntegerField,  # noqa: TID251
    serializers.FloatField: FloatField,  # noqa: TID251
    serializers.DecimalField: DecimalField,  # noqa: TID251
}


class StrictSerializer(serializers.Serializer):
    """Unknown and read-only keys are field errors (a 400, nothing written), not silently dropped.

    DRF ignores them, so a typo (``tensor_paralel_size``) or an attempt to set ``status`` would
    succeed while doing something else than asked. One with no fields takes only an empty body (an
    action's, such as a plan's apply) or ``{}``.
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


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    """A ModelSerializer that rejects keys it would otherwise ignore (`StrictSerializer`)."""

    # Generated number fields and foreign keys take ASCII digits only (the module's docstring).
    serializer_field_mapping = {
        model_field: _ASCII_NUMBERS.get(field, field)
        for model_field, field in serializers.ModelSerializer.serializer_field_mapping.items()
    }
    serializer_related_field = PrimaryKeyRelatedField


class NameRelatedField(serializers.SlugRelatedField):
    """A row given by its name (``slug_field``). A name holding a NUL character is a 400 like
    DRF's CharField gives: PostgreSQL text cannot hold NUL, so looking such a name up would raise
    DataError (a 500) rather than find nothing."""

    default_error_messages = {"null_characters": "Null characters are not allowed."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("null_characters")
        return super().to_internal_value(data)
