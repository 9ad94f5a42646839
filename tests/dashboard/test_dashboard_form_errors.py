"""Form posts that fail: every field error shown beside its input, with its message; nothing saved."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from dashboard import forms
from django.test import Client
from jobs.models import Job
from jobs.services import create_job
from registry.models import MAX_CONTEXT_LENGTH, ServedModel
from rest_framework.validators import UniqueValidator

from tests.dashboard.test_dashboard_pages import FORM
from tests.planning.helpers import make_model

pytestmark = pytest.mark.django_db


def field_errors(response: object) -> dict[str, list[str]]:
    page = response.content.decode()  # type: ignore[attr-defined]
    found: dict[str, list[str]] = {}
    for field, message in re.findall(r'<p class="field-error" data-field="([^"]+)">(.*?)</p>', page):
        found.setdefault(field, []).append(html.unescape(message))
    return found


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ('{"steps": 0}', "steps: Ensure this value is greater than or equal to 1."),
        ('{"steps": 1, "colour": "red"}', "colour: Unknown parameter."),
        ("[1]", "Parameters must be a JSON object."),
    ],
)
def test_it_shows_the_message_of_a_bad_job_parameter_not_only_its_name(
    admin_client: Client, params: str, message: str
) -> None:
    response = admin_client.post("/jobs/start/", {"kind": "noop", "params": params})
    assert response.status_code == 400
    assert field_errors(response)["params"] == [message]
    assert not Job.objects.exists()


def test_it_lists_the_other_field_errors_when_engine_options_are_not_json(admin_client: Client) -> None:
    form = {**FORM, "engine_options": "{oops", "tensor_parallel_size": "3", "name": ""}
    response = admin_client.post("/models/new/", form)
    assert response.status_code == 400
    errors = field_errors(response)
    assert set(errors) == {"engine_options", "tensor_parallel_size", "name"}
    assert errors["engine_options"][0].startswith("Not valid JSON")
    assert not ServedModel.objects.exists()


def test_it_names_a_taken_name_in_its_field_error_on_create_and_edit(
    admin_client: Client, served_model: ServedModel
) -> None:
    taken = [f"A model named '{served_model.name}' already exists; choose another name."]
    response = admin_client.post("/models/new/", {**FORM, "name": served_model.name})
    assert response.status_code == 400 and field_errors(response)["name"] == taken
    other = make_model("other-model")
    edited = admin_client.post(f"/models/{other.pk}/edit/", {**FORM, "name": served_model.name})
    assert edited.status_code == 400 and field_errors(edited)["name"] == taken
    assert sorted(ServedModel.objects.values_list("name", flat=True)) == sorted(
        [served_model.name, "other-model"]
    )


def test_it_answers_a_name_taken_after_validation_with_a_field_error(
    admin_client: Client, served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A concurrent request registering the same name between is_valid() and save(): the unique
    # check passes, the insert hits the database's constraint.
    monkeypatch.setattr(UniqueValidator, "__call__", lambda self, value, field: None)
    response = admin_client.post("/models/new/", {**FORM, "name": served_model.name})
    assert response.status_code == 400
    assert field_errors(response)["name"] == [
        f"A model named '{served_model.name}' already exists; choose another name."
    ]
    assert ServedModel.objects.count() == 1


def test_it_refuses_a_context_length_beyond_the_bound_on_create_and_edit(
    admin_client: Client, served_model: ServedModel
) -> None:
    form = {**FORM, "max_context_length": "1000000000000"}
    created = admin_client.post("/models/new/", form)
    assert created.status_code == 400
    assert field_errors(created)["max_context_length"] == [
        f"Ensure this value is less than or equal to {MAX_CONTEXT_LENGTH}."
    ]
    edited = admin_client.post(f"/models/{served_model.pk}/edit/", {**form, "name": served_model.name})
    assert edited.status_code == 400 and "max_context_length" in field_errors(edited)
    served_model.refresh_from_db()
    assert served_model.max_context_length == 256
    assert list(ServedModel.objects.values_list("name", flat=True)) == [served_model.name]


def test_a_refused_job_form_names_the_jobs_page_for_its_live_socket(admin_client: Client) -> None:
    # The refused form is rendered at POST-only /jobs/start/ with the jobs socket on it. live.js
    # checks access at, and signs in back to, the page the body names: a GET of /jobs/start/ is a
    # 405 signed in or not, so a signed-out tab could not tell and retried for ever.
    page = admin_client.post("/jobs/start/", {"kind": "bogus", "params": "{}"})
    assert page.status_code == 400
    text = page.content.decode()
    assert 'data-socket="/ws/dashboard/jobs/"' in text and 'data-page="/jobs/"' in text
    admin_client.logout()
    named = admin_client.get("/jobs/")  # what live.js fetches now: a signed-out browser is told so
    assert named.status_code == 302 and named["Location"].startswith("/accounts/login/")
    assert admin_client.get("/jobs/start/").status_code == 405  # what it fetched before


def test_a_profile_job_refused_when_stored_shows_the_form_again(
    admin_client: Client, admin_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two operators start a profile of one model together: both forms pass validation, the first
    # job is stored, and the second is refused when it is stored (jobs.kinds.profile.admit): the
    # form again with the reason, not a 500.
    make_model("llama-3-8b")
    params = '{"model": "llama-3-8b", "preset_gpu": "h100"}'
    validate = forms.job_serializer
    first: list[Job] = []

    def validate_then_race(post: Any) -> Any:
        checked = validate(post)
        first.append(create_job("profile", {"model": "llama-3-8b", "preset_gpu": "h100"}, admin_user))
        return checked

    monkeypatch.setattr(forms, "job_serializer", validate_then_race)
    response = admin_client.post("/jobs/start/", {"kind": "profile", "params": params})
    assert response.status_code == 400
    assert field_errors(response)["params"] == [
        f"model: Profile job {first[0].pk} of this model is already queued; wait for it or cancel it."
    ]
    assert list(Job.objects.all()) == first


# Python's json reads these, the API's strict parser does not: a textarea holding one was a 500
# (too many digits, too deep) or stored NaN/Infinity, which PostgreSQL's jsonb refuses (a 500 there).
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9" * 5000, "A number in it has too many digits."),
        ("[" * 5000 + "]" * 5000, "Nested too deeply."),
        ('{"aqua_options": {"x": NaN}}', "Not a finite JSON number: NaN (JSON has no NaN or Infinity)."),
        ('{"aqua_options": {"x": 1e400}}', "Not a finite JSON number: 1e400 (JSON has no NaN or Infinity)."),
        ("-Infinity", "Not a finite JSON number: -Infinity (JSON has no NaN or Infinity)."),
        # Half of a UTF-16 pair: PostgreSQL's jsonb refused to store it (a 500), and an unknown
        # option's name holding one could not be encoded in the page naming it (a 500 on SQLite too).
        ('{"extra_args": ["\\ud800"]}', "A lone surrogate \\ud800 (half of a UTF-16 pair) is no text."),
        ('{"\\udfff": 1}', "A lone surrogate \\udfff (half of a UTF-16 pair) is no text."),
    ],
)
def test_a_json_textarea_python_reads_but_json_does_not_is_a_field_error(
    admin_client: Client, text: str, message: str
) -> None:
    model = admin_client.post("/models/new/", {**FORM, "engine_options": text})
    assert model.status_code == 400
    assert field_errors(model) == {"engine_options": [message]}
    job = admin_client.post("/jobs/start/", {"kind": "noop", "params": text})
    assert job.status_code == 400
    assert field_errors(job) == {"params": [message]}
    assert not ServedModel.objects.exists() and not Job.objects.exists()
