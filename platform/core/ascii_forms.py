"""Django form fields that read numbers (and primary keys) from ASCII digits only, and the admin
mixin that gives every admin form them.

Django's ``IntegerField``, ``FloatField``, ``DecimalField`` and the model choice fields read a
posted value with ``int()`` / ``float()`` / ``Decimal()``, which take any Unicode decimal digit: an
admin form posting full-width ``"\\uff12"`` saved 2, and a foreign key posted so chose row 2. The
check is the API's, `core.serializers.non_ascii_digits`, here raised as a form field error.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import models

from core.serializers import non_ascii_digits


def refuse_non_ascii_digits(value: Any) -> None:
    """Raise a form ValidationError when ``value`` is a string that is not all ASCII."""
    error = non_ascii_digits(value)
    if error is not None:
        raise forms.ValidationError(error, code="non_ascii_digits")


class AsciiDigits(forms.Field):
    def to_python(self, value: Any) -> Any:
        refuse_non_ascii_digits(value)
        return super().to_python(value)


class IntegerField(AsciiDigits, forms.IntegerField):
    pass


class FloatField(AsciiDigits, forms.FloatField):
    pass


class DecimalField(AsciiDigits, forms.DecimalField):
    pass


class ModelChoiceField(AsciiDigits, forms.ModelChoiceField):
    pass


class ModelMultipleChoiceField(forms.ModelMultipleChoiceField):
    def clean(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            for item in value:
                refuse_non_ascii_digits(item)
        return super().clean(value)


# A model field -> the form field its admin input gets (the first match in this order).
_FORM_CLASSES: tuple[tuple[type[models.Field], type[forms.Field]], ...] = (
    (models.ForeignKey, ModelChoiceField),
    (models.ManyToManyField, ModelMultipleChoiceField),
    (models.DecimalField, DecimalField),
    (models.FloatField, FloatField),
    (models.IntegerField, IntegerField),
)


class AsciiDigitsAdmin:
    """A ModelAdmin or inline mixin: its forms' number and relation inputs take ASCII digits only."""

    def formfield_for_dbfield(self, db_field: models.Field, request: Any, **kwargs: Any) -> Any:
        if not db_field.choices:  # a choice is checked against the choices' own text
            for model_field, form_class in _FORM_CLASSES:
                if isinstance(db_field, model_field):
                    kwargs.setdefault("form_class", form_class)
                    break
        return super().formfield_for_dbfield(db_field, request, **kwargs)  # type: ignore[misc]
