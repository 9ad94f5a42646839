from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.serializers import StrictModelSerializer
from jobs.models import Job
from jobs.registry import get_kind, kind_names


class JobSerializer(StrictModelSerializer):
    """A job. Clients send ``kind`` and ``params``; everything else is written by the platform."""

    kind = serializers.CharField()
    params = serializers.JSONField(required=False, default=dict)
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "kind",
            "params",
            "status",
            "progress",
            "result",
            "error",
            "celery_id",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "worker",
            "heartbeat_at",
        ]
        read_only_fields = [name for name in fields if name not in ("kind", "params")]  # set by workers

    def validate_kind(self, value: str) -> str:
        if value not in kind_names():
            raise serializers.ValidationError(
                f"Unknown job kind {value!r}; known: {', '.join(kind_names())}."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        params = get_kind(attrs["kind"]).params_serializer(data=attrs.get("params", {}))
        if not params.is_valid():
            raise serializers.ValidationError({"params": params.errors})
        attrs["params"] = dict(params.validated_data)
        return attrs


class JobKindSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    params = serializers.JSONField()


def describe_kinds() -> list[dict[str, Any]]:
    """Each registered kind with its parameters, for clients that build job forms."""
    return [
        {
            "name": name,
            "description": get_kind(name).description,
            "params": _describe(get_kind(name).params_serializer()),
        }
        for name in kind_names()
    ]


def _describe(serializer: serializers.Serializer) -> dict[str, dict[str, Any]]:
    return {name: _describe_field(field) for name, field in serializer.fields.items()}


# DRF names a list's item-count bounds as a string's character-count bounds: described apart.
_LIST_BOUNDS = {"min_length": "min_items", "max_length": "max_items"}


def _describe_field(field: serializers.Field) -> dict[str, Any]:
    """A parameter's type, whether it is required, its default and bounds; a choice's choices, an
    object's own parameters (``params``) and a list's items (``items``), so a client can build the
    whole form (without them a ``workload`` or ``solver`` could only be found by trial and error).

    Bounds: ``min_value``/``max_value`` of a number, ``min_length``/``max_length`` of a string's
    characters, ``min_items``/``max_items`` of a list's items (DRF names both lengths ``*_length``:
    a list's ``max_length`` read as its items' length limit, or a string's as an item count)."""
    if isinstance(field, serializers.Serializer):
        spec: dict[str, Any] = {"type": "object", "params": _describe(field)}
    else:
        spec = {"type": type(field).__name__.removesuffix("Field").lower()}
    spec["required"] = field.required
    if field.default is not serializers.empty:
        spec["default"] = field.default
    renamed = _LIST_BOUNDS if isinstance(field, serializers.ListField) else {}
    for bound in ("min_value", "max_value", "min_length", "max_length"):
        if getattr(field, bound, None) is not None:
            spec[renamed.get(bound, bound)] = getattr(field, bound)
    if isinstance(field, serializers.ListField) and not field.allow_empty and field.min_length is None:
        spec["min_items"] = 1  # an empty list is refused
    if isinstance(field, serializers.ChoiceField):
        spec["choices"] = list(field.choices)
    if isinstance(field, serializers.ListField):
        spec["items"] = _describe_field(field.child)
        del spec["items"]["required"]
    if field.help_text:
        spec["help"] = str(field.help_text)
    return spec
