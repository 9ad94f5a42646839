"""HTML form posts validated by the REST API's own serializers (one set of rules for both).

A browser form sends every value as text; these helpers turn it into the JSON-shaped data the
API serializer expects (numbers stay strings: DRF's fields parse them exactly as for JSON input),
then return the serializer so that views render its field errors beside the inputs.
"""

from __future__ import annotations

import json
from typing import Any

from accounts.api.serializers import QUOTA_FIELDS, ApiKeySerializer
from django.db.models import Field
from django.http import HttpRequest, QueryDict
from jobs.api.serializers import JobSerializer
from registry.api.serializers import ServedModelSerializer
from registry.models import ServedModel
from rest_framework.settings import api_settings

from core import strict_json as strict

MODEL_FIELDS = [
    "name",
    "source",
    "dtype",
    "tensor_parallel_size",
    "max_context_length",
    "slo_ttft_p99_ms",
    "slo_tbt_p99_ms",
    "slo_attainment_pct",
    "engine_options",
]
# Fields with a model default: an empty input means "use the default" (the placeholders show it),
# when registering a model as when editing one: an emptied engine-options box clears the options,
# a blank attainment is the default 90 again, not the old value kept.
OPTIONAL_MODEL_FIELDS = {"dtype", "tensor_parallel_size", "slo_attainment_pct", "engine_options"}


def shown(raw: str, limit: int = 40) -> str:
    """``raw`` quoted for a message, cut to ``limit`` characters: a refusal names what was typed
    without repeating a pasted page of it."""
    return repr(raw if len(raw) <= limit else raw[:limit] + "…")


class JsonInputError(ValueError):
    """A textarea meant to hold JSON does not."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _json_field(field: str, text: str) -> Any:
    """``text`` read as strict JSON (as the API's parser reads a body); `JsonInputError` otherwise."""
    try:
        value = strict.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonInputError(
            field, f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    except strict.NotFinite as exc:
        number = str(exc) if len(str(exc)) <= 40 else str(exc)[:40] + "…"
        raise JsonInputError(
            field, f"Not a finite JSON number: {number} (JSON has no NaN or Infinity)."
        ) from None
    except ValueError:  # an integer of more digits than int() reads (4300)
        raise JsonInputError(field, "A number in it has too many digits.") from None
    except RecursionError:
        raise JsonInputError(field, "Nested too deeply.") from None
    surrogate = strict.lone_surrogate(value)
    if surrogate is not None:  # the API's parser refuses it too: no text holds one
        raise JsonInputError(field, f"A lone surrogate {surrogate} (half of a UTF-16 pair) is no text.")
    return value


def model_data(post: QueryDict, skip: frozenset[str] = frozenset(), editing: bool = False) -> dict[str, Any]:
    """The API payload for a served-model form post, without the fields in ``skip``.

    An empty optional field is left out of a create (the serializer fills the model's default).
    An edit is a partial update, where a missing key keeps the stored value: there it is given
    the default explicitly. The form posts every field, so a field missing from the post is
    treated as an empty one."""
    data: dict[str, Any] = {}
    for name in MODEL_FIELDS:
        value = post.get(name, "").strip()
        if name in skip:
            continue
        if name in OPTIONAL_MODEL_FIELDS and value == "":
            if editing:
                data[name] = _model_default(name)
            continue
        data[name] = _json_field(name, value) if name == "engine_options" else value
    return data


def _model_default(name: str) -> Any:
    field = ServedModel._meta.get_field(name)
    assert isinstance(field, Field)  # a concrete column, not a reverse relation
    return field.get_default()


Errors = dict[str, list[str]]


def field_errors(errors: Any) -> Errors:
    """Serializer errors as ``field -> [message]`` for the template. Nested errors (a job's
    ``params`` are checked by the kind's own serializer) become ``"<key>: <message>"`` lines under
    their field: listed as they are, a dict would show only its keys."""
    return {str(name): _messages(value) for name, value in dict(errors).items()}


def _messages(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        out = []
        for key, inner in value.items():
            label = "" if key == api_settings.NON_FIELD_ERRORS_KEY else f"{key}: "
            out += _messages(inner, prefix + label)
        return out
    if isinstance(value, list | tuple):
        return [message for item in value for message in _messages(item, prefix)]
    return [f"{prefix}{value}"]


def model_serializer(
    post: QueryDict, instance: ServedModel | None = None
) -> tuple[ServedModelSerializer | None, Errors]:
    """A validated serializer for a create or, with ``instance``, an edit, and the field errors.

    The serializer is None when a value could not even be parsed (``engine_options`` not JSON);
    the other fields are still checked, so that the page lists every error at once.
    """
    editing = instance is not None
    try:
        data = model_data(post, editing=editing)
    except JsonInputError as exc:
        rest = model_data(post, skip=frozenset({exc.field}), editing=editing)
        others = ServedModelSerializer(instance, data=rest, partial=instance is not None)
        others.is_valid()
        return None, {**field_errors(others.errors), exc.field: [str(exc)]}
    serializer = ServedModelSerializer(instance, data=data, partial=instance is not None)
    serializer.is_valid()
    return serializer, field_errors(serializer.errors)


def job_serializer(post: QueryDict) -> tuple[JobSerializer | None, Errors]:
    """A validated serializer for a job form post (``kind`` and a JSON ``params`` textarea)."""
    text = post.get("params", "").strip()
    try:
        params = _json_field("params", text) if text else {}
    except JsonInputError as exc:
        return None, {exc.field: [str(exc)]}
    serializer = JobSerializer(data={"kind": post.get("kind", ""), "params": params})
    serializer.is_valid()
    return serializer, field_errors(serializer.errors)


API_KEY_FIELDS = ["name", "requests_per_minute", "tokens_per_day"]


def api_key_serializer(post: QueryDict, request: HttpRequest) -> tuple[ApiKeySerializer, Errors]:
    """A validated serializer for a new API key of ``request.user``, and the field errors.

    An empty quota is left out, so that the configured default applies (as when the API's body
    omits it); a quota given by a non-admin is refused there ("Only admins may set quotas.")."""
    data: dict[str, Any] = {"name": post.get("name", "")}
    for name in QUOTA_FIELDS:
        value = post.get(name, "").strip()
        if value:
            data[name] = value
    serializer = ApiKeySerializer(data=data, context={"request": request})
    serializer.is_valid()
    return serializer, field_errors(serializer.errors)
