"""Bad input to any form of the dashboard is refused with a message and writes nothing, never a 500.

The REST API has its own walk (tests/control_plane/test_api_bad_input_properties.py); the
dashboard's HTML forms parse text themselves (JSON textareas, GPU index lists, the key form's
one-time value) before the API's serializers see it, so they are walked here too. For each form,
hypothesis posts, as an admin: the form's valid fields with some (at least one) replaced by a
wrong value (huge or non-finite numbers, NUL and other control characters, digits of other
scripts, very long text, JSON that Python reads but a database cannot store) or dropped; bytes
that are no form at all; path ids of rows that do not exist. Pages are read with bad query strings.

A refused post answers a 4xx (a refused form: 400, its page again with the error beside the input
or as the refusal) and writes no row; an accepted one redirects (or, for a key, 201) to a page that
renders. Each example runs in a transaction rolled back at its end, so examples start from the same
rows (make_world's). DASHBOARD_WALK_EXAMPLES sets the examples per form (default 20).

Run it on PostgreSQL too (DATABASE_URL): its text and jsonb cannot hold NUL, nor jsonb NaN, which
SQLite stores without complaint.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from accounts.models import ApiKey, User
from accounts.services import create_api_key
from deployments.models import Deployment
from django.db import transaction
from django.db.models import Model
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventory.models import Device, DeviceKind, Host
from jobs.models import Job
from planning.models import ModelProfile, PlacementPlan
from registry.models import ServedModel

from tests.control_plane.routes import World, make_world
from tests.dashboard.test_dashboard_pages import FORM as MODEL_FORM

EXAMPLES = int(os.environ.get("DASHBOARD_WALK_EXAMPLES", "20"))
TABLES: tuple[type[Model], ...] = (
    User, ApiKey, ServedModel, Host, Device, Deployment, Job, PlacementPlan, ModelProfile,
)  # fmt: skip

# Text a browser could post in any input: numbers no column holds, non-finite ones, other scripts'
# digits, control characters, very long text, JSON literals where a number is expected.
ADVERSARIAL = [
    "", " ", "-1", "0", "1.5", "1e308", "-1e308", "1e309", "nan", "NaN", "inf", "-inf", "Infinity",
    str(10**30), str(-(10**30)), str(2**63), str(2**31), "9" * 5000, "²", "٣", "\uff11\uff12", "1\x00",
    "\x00", "a\x00b", "\x01\x02\x1b\x7f", "\u200b", "\ud7ff", "x" * 10_000, "é" * 2000, "\U0001f600" * 500,
    "true", "null", "[]", "{}", "[1]", " 1 ", "0x10", "1_000", "1,2", "%00",
]  # fmt: skip
# NUL anywhere in a value: PostgreSQL's text refuses it, SQLite's does not.
WITH_NUL = st.tuples(st.text(max_size=8), st.text(max_size=8)).map(lambda pair: "\x00".join(pair))
BAD_TEXT = st.one_of(
    st.sampled_from(ADVERSARIAL),
    WITH_NUL,
    st.text(max_size=30),
    st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=5),
)
# JSON text Python's json module reads (NaN, Infinity, \u0000, huge or deep numbers) or refuses.
_NAN_LIKE = ["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000, '"\\u0000"', '"a\\u0000"', "1e308"]
BAD_JSON = st.one_of(
    st.sampled_from(ADVERSARIAL),
    st.sampled_from(_NAN_LIKE),
    st.sampled_from(["[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000, "{", '{"\\u0000": 1}']),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    ).map(json.dumps),
)


def _json_object(keys: list[str]) -> st.SearchStrategy[str]:
    """A JSON object of known keys, each with a value from _NAN_LIKE or any JSON (as the form's text)."""
    value = st.one_of(st.sampled_from(_NAN_LIKE), st.sampled_from(['{"x": NaN}', '["\\u0000"]', "{}"]))
    return st.dictionaries(st.sampled_from(keys), value, min_size=1, max_size=3).map(
        lambda obj: "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in obj.items()) + "}"
    )


ENGINE_OPTIONS = ["seed", "max_num_seqs", "gpu_memory_utilization", "aqua_options", "extra_args", "sim_rate"]
JOB_PARAMS = ["steps", "delay_s", "fail_at_step", "models", "solver", "model", "backend"]
JSON_TEXT: dict[str, st.SearchStrategy[str]] = {
    "engine_options": st.one_of(BAD_JSON, _json_object(ENGINE_OPTIONS)),
    "params": st.one_of(BAD_JSON, _json_object(JOB_PARAMS)),
}

# Path ids: rows that do not exist, numbers past any column, and text the <int:pk> route refuses.
MISSING_ID = st.sampled_from(["0", "999999", str(2**31), str(2**63), str(10**30), "9" * 5000, "00"])
NOT_AN_ID = st.sampled_from(["-1", "abc", "1e3", "\uff11", "٣", "²", "%00", "1%00", "null", " 1"])


@dataclass(frozen=True)
class Form:
    """A dashboard form: its path (``{id}`` is the row it acts on), its valid fields, and the rows
    whose count it may change when it succeeds."""

    path: str
    valid: Callable[[World], dict[str, str]]
    real_id: Callable[[World], int] | None = None


def _deploy_fields(world: World) -> dict[str, str]:
    return {"host": world.host.name, "gpus": "1"}


def _job_fields(world: World) -> dict[str, str]:
    return {"kind": "noop", "params": '{"steps": 1, "delay_s": 0}'}


def _key_fields(world: World) -> dict[str, str]:
    return {"name": "walk-key", "requests_per_minute": "10", "tokens_per_day": "1000"}


def _nothing(world: World) -> dict[str, str]:
    return {}


FORMS: dict[str, Form] = {
    "model-create": Form("/models/new/", lambda w: dict(MODEL_FORM)),
    "model-edit": Form("/models/{id}/edit/", lambda w: dict(MODEL_FORM), lambda w: w.model.pk),
    "model-deploy": Form("/models/{id}/deploy/", _deploy_fields, lambda w: w.model.pk),
    "model-delete": Form("/models/{id}/delete/", _nothing, lambda w: w.model.pk),
    "job-start": Form("/jobs/start/", _job_fields),
    "job-cancel": Form("/jobs/{id}/cancel/", _nothing, lambda w: w.job.pk),
    "plan-apply": Form("/jobs/{id}/apply/", _nothing, lambda w: w.job.pk),
    "api-key-create": Form("/api-keys/new/", _key_fields),
    "api-key-revoke": Form("/api-keys/{id}/revoke/", _nothing, lambda w: w.viewer_key.pk),
    "deployment-stop": Form("/deployments/{id}/stop/", _nothing, lambda w: w.deployment.pk),
    "deployment-start": Form("/deployments/{id}/start/", _nothing, lambda w: w.deployment.pk),
    "deployment-delete": Form("/deployments/{id}/delete/", _nothing, lambda w: w.deployment.pk),
}
PAGES = [
    "/", "/models/", "/models/{model}/", "/models/new/", "/models/{model}/edit/", "/jobs/", "/jobs/{job}/",
    "/api-keys/", "/deployments/{deployment}/logs/",
]  # fmt: skip


@st.composite
def _fields(draw: st.DrawFn, valid: dict[str, str]) -> list[tuple[str, str]]:
    """``valid`` with some fields (at least one, when there are any) wrong, some dropped, perhaps an
    unknown one added and a field sent twice (the view reads the last)."""
    body = dict(valid)
    names = sorted(body)
    if names:
        for name in draw(st.lists(st.sampled_from(names), min_size=1, unique=True)):
            body[name] = draw(JSON_TEXT.get(name, BAD_TEXT))
        for name in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
            if draw(st.booleans()):
                del body[name]
    pairs = list(body.items())
    if draw(st.booleans()):
        extra = draw(st.sampled_from([*names, "extra", "\x00", "csrfmiddlewaretoken"]))
        pairs.append((extra, draw(BAD_TEXT)))
    return pairs


def _counts() -> dict[str, int]:
    return {table.__name__: table._default_manager.count() for table in TABLES}


def _model_row(pk: int) -> dict[str, Any]:
    row = ServedModel.objects.filter(pk=pk).values().first()
    return {} if row is None else dict(row)


@pytest.fixture
def walk(db: None) -> tuple[World, Client]:
    world = make_world()
    create_api_key(world.admin, "alice-key")
    Device.objects.create(
        host=world.host,
        index=1,
        uuid="GPU-sim-a-1",
        name="H100",
        kind=DeviceKind.GPU,
        memory_total_bytes=1 << 36,
    )  # a free GPU: the valid deploy form deploys on it
    client = Client()
    client.force_login(world.admin)
    return world, client


def _issued_form(client: Client) -> str:
    page = client.get("/api-keys/").content.decode()
    found = re.search(r'<input type="hidden" name="form" value="([^"]+)">', page)
    assert found is not None
    return found.group(1)


def _refused_with_a_message(response: Any) -> bool:  # the test client's response
    page = response.content.decode(errors="replace")
    return 'class="field-error"' in page or 'id="refusal"' in page


def _check(client: Client, what: str, response: Any, before: dict[str, int], after: dict[str, int]) -> None:
    status = response.status_code
    assert status < 500, f"{what}: {status} {response.content[:500]!r}"
    if 400 <= status < 500:
        assert after == before, f"{what} answered {status} but wrote rows: {before} -> {after}"
        if status == 400 and response["Content-Type"].startswith("text/html"):
            assert _refused_with_a_message(response), f"{what}: a 400 without a message"
    elif status in (301, 302, 303):
        shown = client.get(response["Location"])
        assert shown.status_code < 500, f"{what} -> {response['Location']}: {shown.status_code}"
    else:
        assert status in (200, 201), f"{what}: {status}"


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # `walk` is made once per test; each example rolls its own writes back (transaction below).
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def _path(form: Form, world: World, data: st.DataObject) -> str:
    if form.real_id is None:
        return form.path
    real = str(form.real_id(world))
    chosen = data.draw(st.one_of(st.just(real), MISSING_ID, NOT_AN_ID), label="id")
    return form.path.replace("{id}", quote(chosen, safe="%"))


@pytest.mark.parametrize("name", sorted(FORMS))
@SETTINGS
@given(data=st.data())
def test_a_bad_form_post_is_refused_with_a_message_and_writes_nothing(
    walk: tuple[World, Client], name: str, data: st.DataObject
) -> None:
    world, client = walk
    form = FORMS[name]
    path = _path(form, world, data)
    raw = None  # one post in ten: bytes that are no form
    if data.draw(st.integers(0, 9), label="raw?") == 0:
        raw = data.draw(st.binary(max_size=40), label="raw body")
    pairs = data.draw(_fields(form.valid(world)), label="fields")
    with transaction.atomic():
        if name == "api-key-create":
            nonce = data.draw(st.one_of(st.just("issued"), BAD_TEXT), label="form")
            pairs.append(("form", _issued_form(client) if nonce == "issued" else nonce))
        edited = _model_row(world.model.pk)
        before = _counts()
        if raw is not None:
            response = client.generic("POST", path, raw, content_type="application/x-www-form-urlencoded")
        else:
            response = client.post(path, urlencode(pairs), content_type="application/x-www-form-urlencoded")
        after = _counts()
        what = f"POST {path} {pairs if raw is None else raw!r}"
        _check(client, what, response, before, after)
        if name == "model-edit" and response.status_code >= 400:
            assert _model_row(world.model.pk) == edited, f"{what} answered {response.status_code} but edited"
        transaction.set_rollback(True)


QUERY_VALUE = st.one_of(BAD_TEXT, MISSING_ID, NOT_AN_ID, st.sampled_from(["1", "2", "-0", "0" * 30 + "1"]))


@pytest.mark.parametrize("page", PAGES)
@SETTINGS
@given(data=st.data())
def test_a_page_read_with_a_bad_query_string_is_never_a_500(
    walk: tuple[World, Client], page: str, data: st.DataObject
) -> None:
    world, client = walk
    path = page.format(model=world.model.pk, job=world.job.pk, deployment=world.deployment.pk)
    keys = st.sampled_from(["page", "through", "model", "since", "q", "\x00", "page[]"])
    query = data.draw(st.lists(st.tuples(keys, QUERY_VALUE), max_size=3), label="query")
    with transaction.atomic():
        before = _counts()
        response = client.get(f"{path}?{urlencode(query)}")
        after = _counts()
        status = response.status_code
        assert status < 500, f"GET {path}?{urlencode(query)}: {status} {response.content[:300]!r}"
        assert status in (200, 400, 404), f"GET {path}?{urlencode(query)}: {status}"
        if status == 400:
            assert _refused_with_a_message(response), f"GET {path}?{urlencode(query)}: no message"
        assert after == before
        transaction.set_rollback(True)


@pytest.mark.parametrize(
    "page", ["9" * 5000, str(10**30), "²", "٣", "\uff11", "\x00", "-1", "0", "1e3", "nan", ""]
)
def test_the_jobs_page_refuses_a_page_that_is_no_page_number(walk: tuple[World, Client], page: str) -> None:
    response = walk[1].get("/jobs/", {"page": page})
    assert response.status_code in (400, 404)
    assert 'id="refusal"' in response.content.decode()
