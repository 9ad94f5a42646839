"""Bad input to any write of the API is a JSON 4xx that changes nothing, never a 500.

The operations come from the API's own OpenAPI document (drf-spectacular), so a write added later is
walked without being named here. For each POST/PUT/PATCH under /api/v1/, hypothesis sends, as an
admin: arbitrary JSON values, bodies shaped like the operation's request schema with some fields
given a wrong-typed or out-of-range value, and bytes that are no JSON at all; a path parameter is
the real object's id or one that is huge, negative or not a number. Each example runs in a
transaction rolled back at its end, so examples start from the same rows (make_world's).

Run it on PostgreSQL too (DATABASE_URL, as .ci/run does): its text cannot hold NUL, which SQLite
stores and looks up without complaint; there this walk found a deployment's model or host name
holding NUL to be a 500.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from accounts.models import ApiKey, ApiToken, User
from accounts.services import create_api_key
from deployments.models import Deployment
from django.core.cache import cache
from django.db import transaction
from django.db.models import Model
from drf_spectacular.generators import SchemaGenerator
from gateway.models import Usage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventory.models import Device, Host
from jobs.models import Job
from jobs.registry import get_kind, kind_names
from planning.models import ModelProfile, PlacementPlan
from registry.models import ServedModel
from rest_framework import serializers

from .conftest import token_client
from .routes import World, make_world

WRITE_METHODS = ("post", "put", "patch")
# The tables a write of the API creates, changes the number of, or could leave half-written.
TABLES: tuple[type[Model], ...] = (
    User, ApiKey, ApiToken, ServedModel, Host, Device, Deployment, Job, PlacementPlan, ModelProfile, Usage,
)  # fmt: skip


def _schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


SCHEMA = _schema()
OPERATIONS = [
    (method, path)
    for path, operations in SCHEMA["paths"].items()
    if path.startswith("/api/v1/")
    for method in operations
    if method in WRITE_METHODS
]


def _request_schema(method: str, path: str) -> dict[str, Any]:
    """The operation's JSON request body schema with its $ref resolved ({} when it takes none)."""
    content = SCHEMA["paths"][path][method].get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema", {})
    return _resolve(schema)


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return _resolve(SCHEMA["components"]["schemas"][ref.rsplit("/", 1)[-1]])


# A body each request schema accepts against make_world's rows, by schema name without "Patched".
# Wrong values replace some of its fields, so the others are valid and validation reaches deeper.
def _valid_bodies(world: World) -> dict[str, dict[str, Any]]:
    return {
        "ApiKeyRequest": {"name": "k", "requests_per_minute": 10, "tokens_per_day": 1000},
        "DeploymentRequest": {
            "model": world.model.name, "host": world.host.name, "devices": [world.device.pk],
            "desired_state": "running",
        },
        "JobRequest": {"kind": "place", "params": {}},
        "ServedModelRequest": {
            "name": "m-1", "source": "/models/m", "dtype": "bfloat16", "tensor_parallel_size": 1,
            "max_context_length": 1024, "slo_ttft_p99_ms": 500.0, "slo_tbt_p99_ms": 50.0,
            "slo_attainment_pct": 90.0, "engine_options": {"gpu_memory_utilization": 0.9},
        },
        "TokenRequestRequest": {"username": world.admin.username, "password": "not-it", "name": "t"},
    }  # fmt: skip


def _schema_name(method: str, path: str) -> str | None:
    content = SCHEMA["paths"][path][method].get("requestBody", {}).get("content", {})
    ref = content.get("application/json", {}).get("schema", {}).get("$ref")
    return None if ref is None else ref.rsplit("/", 1)[-1].removeprefix("Patched")


BIG = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1, -(10**30)])
HUGE_FLOAT = st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 5e-324, -0.0])
LONG_TEXT = st.sampled_from(["x" * 10_000, "é" * 2_000, "\U0001f600" * 500, "\x00", "a\x00b", " ", ""])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    BIG,
    st.floats(allow_nan=False, allow_infinity=False),
    HUGE_FLOAT,
    st.text(max_size=30),
    LONG_TEXT,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _wrong(field: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of the wrong type for ``field``, or of its type but out of range."""
    field = _resolve(field)
    kind = field.get("type")
    wrong_type: st.SearchStrategy[Any] = JSON_VALUES
    if kind == "integer":
        in_type: st.SearchStrategy[Any] = st.one_of(BIG, st.integers(-5, 0), HUGE_FLOAT, st.just(1.5))
    elif kind == "number":
        in_type = st.one_of(HUGE_FLOAT, BIG, st.sampled_from([10**400, -(10**400), 0, -1]))
    elif kind == "string":
        in_type = st.one_of(LONG_TEXT, st.text(max_size=30))
    elif kind == "array":
        in_type = st.lists(st.one_of(BIG, SCALARS), max_size=4)
    else:  # an enum, an object, or anything ({}): strings it does not name and nested values
        in_type = st.one_of(
            LONG_TEXT, st.text(max_size=30), st.dictionaries(st.text(max_size=5), JSON_VALUES)
        )
    return st.one_of(wrong_type, in_type)


@st.composite
def _shaped_body(draw: st.DrawFn, schema: dict[str, Any], valid: dict[str, Any]) -> dict[str, Any]:
    """``valid`` with some of the schema's fields (at least one) wrong, and perhaps some dropped."""
    properties: dict[str, Any] = schema.get("properties", {})
    body = dict(valid)
    names = sorted(properties)
    if not names:
        return body
    wrong = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    for name in wrong:
        body[name] = draw(_wrong(properties[name]))
    for name in draw(st.lists(st.sampled_from(sorted(body)), max_size=2, unique=True)):
        if name not in wrong:
            del body[name]
    return body


# A job's params are one JSON object in the schema ({}); each kind's parameter serializer names them.
_FIELD_TYPES = (
    (serializers.BooleanField, "boolean"), (serializers.IntegerField, "integer"),
    (serializers.FloatField, "number"), (serializers.ListField, "array"), (serializers.CharField, "string"),
    (serializers.ChoiceField, "string"),
)  # fmt: skip
_VALID_PARAMS: dict[str, Callable[[World], dict[str, Any]]] = {
    "noop": lambda world: {"steps": 1, "delay_s": 0.0},
    "place": lambda world: {"solver": "greedy", "models": [world.model.name]},
    "profile": lambda world: {"model": world.model.name},
}


def _wrong_param(field: serializers.Field) -> st.SearchStrategy[Any]:
    if isinstance(field, serializers.Serializer):
        return st.fixed_dictionaries({}, optional={name: _wrong_param(f) for name, f in field.fields.items()})
    kind = next((name for cls, name in _FIELD_TYPES if isinstance(field, cls)), "object")
    return _wrong({"type": kind})


@st.composite
def _job_body(draw: st.DrawFn, world: World) -> dict[str, Any]:
    """A job of a known kind with some of its parameters (at least one) wrong."""
    kind = draw(st.sampled_from(kind_names()))
    fields = get_kind(kind).params_serializer().fields
    params = dict(_VALID_PARAMS[kind](world))
    for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, unique=True)):
        params[name] = draw(_wrong_param(fields[name]))
    return {"kind": kind, "params": params}


NOT_AN_ID = st.one_of(
    BIG.map(str),
    st.integers(-(10**6), -1).map(str),
    st.sampled_from(
        ["0", "abc", "1e3", "0x10", "\uff11\uff12", "1 ", "-", "%00", "\x00", "1\x00", "null", "9" * 200]
    ),
    st.text(
        alphabet=st.characters(blacklist_characters="/.?#%", blacklist_categories=("Cs", "Cc")), min_size=1
    ),
)


def _form(body: dict[str, Any]) -> str:
    """The body as an HTML form sends it: each value as text, a list as repeated fields."""
    pairs: list[tuple[str, str]] = []
    for key, value in body.items():
        for item in value if isinstance(value, list) else [value]:
            pairs.append((key, item if isinstance(item, str) else json.dumps(item)))
    return urlencode(pairs)


def _counts() -> dict[str, int]:
    return {table.__name__: table._default_manager.count() for table in TABLES}


@pytest.fixture
def world(db: None) -> World:
    world = make_world()
    create_api_key(world.admin, "alice-key")  # the admin's own key: the one the key routes act on
    return world


def test_every_job_kind_has_valid_params() -> None:
    assert set(kind_names()) <= set(_VALID_PARAMS)


def test_every_write_of_the_api_is_walked() -> None:
    assert ("post", "/api/v1/models/") in OPERATIONS
    assert ("patch", "/api/v1/deployments/{id}/") in OPERATIONS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=lambda value: str(value))
@settings(
    max_examples=25,
    deadline=None,
    # `world` is made once per test; each example rolls its own writes back (transaction below).
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_bad_input_to_a_write_is_a_json_4xx_that_changes_nothing(
    world: World, method: str, path: str, data: st.DataObject
) -> None:
    schema = _request_schema(method, path)
    name = _schema_name(method, path)
    valid = _valid_bodies(world)
    assert name is None or name in valid, f"add a valid {name} to _valid_bodies"
    json_body = "application/json"
    body_strategies: list[st.SearchStrategy[tuple[str | bytes, str]]] = [
        st.tuples(JSON_VALUES.map(json.dumps), st.just(json_body)),
        st.tuples(st.binary(max_size=50), st.just(json_body)),
    ]
    if name is not None:
        shaped = _shaped_body(schema, valid[name])
        body_strategies.append(st.tuples(shaped.map(json.dumps), st.just(json_body)))
        body_strategies.append(st.tuples(shaped.map(_form), st.just("application/x-www-form-urlencoded")))
    if name == "JobRequest":
        body_strategies.append(st.tuples(_job_body(world).map(json.dumps), st.just(json_body)))
    body, content_type = data.draw(st.one_of(*body_strategies), label="body")

    real = {"id": _real_id(world, path), "job": str(world.job.pk)}
    concrete = path
    for parameter, value in real.items():
        if "{" + parameter + "}" in path:
            chosen = data.draw(st.one_of(st.just(value), NOT_AN_ID), label=parameter)
            concrete = concrete.replace("{" + parameter + "}", quote(chosen, safe=""))
    assert "{" not in concrete, f"fill the path parameters of {path}"

    client = token_client(world.admin)
    cache.clear()  # the token endpoint's throttle would otherwise answer every later example 429
    with transaction.atomic():
        before = _counts()
        response = client.generic(method.upper(), concrete, body, content_type=content_type)
        after = _counts()
        transaction.set_rollback(True)
    status = response.status_code
    assert status < 500, f"{method.upper()} {concrete} {body!r}: {status} {response.content[:500]!r}"
    if 400 <= status < 500:
        assert response["Content-Type"].startswith("application/json"), response.content[:200]
        json.loads(response.content)
        assert after == before, f"{method.upper()} {concrete} answered {status} but wrote rows"


def _real_id(world: World, path: str) -> str:
    collection = path.removeprefix("/api/v1/").split("/")[0]
    return str(
        {
            "api-keys": ApiKey.objects.get(owner=world.admin).pk,
            "models": world.model.pk,
            "deployments": world.deployment.pk,
            "jobs": world.job.pk,
            "hosts": world.host.pk,
            "devices": world.device.pk,
        }.get(collection, "")
    )
