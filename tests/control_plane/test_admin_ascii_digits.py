"""Numbers posted to the admin's forms take ASCII digits only, as the API's do: Django's form fields
read them with int() / float(), which take any Unicode decimal digit ("\uff12", full-width 2, saved
2; a foreign key so written chose row 2). Each is a field error with the API's message
(core.ascii_forms, sharing core.serializers.non_ascii_digits)."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import User
from django import forms
from django.contrib import admin
from django.test import Client, RequestFactory
from jobs.models import Job
from registry.models import ServedModel

from tests.dashboard.test_dashboard_pages import FORM

pytestmark = pytest.mark.django_db

FULL_WIDTH_2 = "\uff12"
ARABIC_INDIC_2 = "\u0662"
NUMBER_FIELDS = (
    forms.IntegerField,
    forms.FloatField,
    forms.DecimalField,
    forms.ModelChoiceField,
    forms.ModelMultipleChoiceField,
)


@pytest.fixture
def root() -> User:
    return User.objects.create_superuser("root", password="root-pw-7d1x")


@pytest.mark.parametrize("digit", [FULL_WIDTH_2, ARABIC_INDIC_2])
def test_it_refuses_a_model_added_in_the_admin_with_non_ascii_digits(root: User, digit: str) -> None:
    client = Client()
    client.force_login(root)
    data = {**FORM, "engine_options": "{}", "tensor_parallel_size": digit, "max_context_length": "8" + digit}
    response = client.post("/admin/registry/servedmodel/add/", data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"tensor_parallel_size", "max_context_length"}
    assert errors["tensor_parallel_size"] == [
        f"Only ASCII digits (0-9) are allowed in a number: {digit!r} (U+{ord(digit):04X}) is not one."
    ]
    assert not ServedModel.objects.exists()


def test_it_refuses_a_foreign_key_chosen_with_non_ascii_digits_in_the_admin(root: User) -> None:
    job = Job.objects.create(kind="noop", params={})
    client = Client()
    client.force_login(root)
    url = f"/admin/jobs/job/{job.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data = {**{k: ("" if v is None else v) for k, v in data.items()}, "created_by": f"{root.pk}".translate(
        str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19")
    )}  # fmt: skip
    response = client.post(url, data)
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["created_by"]
    job.refresh_from_db()
    assert job.created_by is None


def admin_forms(request: Any) -> list[tuple[str, Any]]:
    """Every registered admin's form class, and its inlines' ones."""
    found: list[tuple[str, Any]] = []
    for model, model_admin in admin.site._registry.items():
        found.append((model.__name__, model_admin.get_form(request)))
        for inline in model_admin.get_inline_instances(request):
            found.append((f"{model.__name__} inline", inline.get_formset(request).form))
    return found


def test_every_number_and_relation_input_of_the_admin_refuses_non_ascii_digits(root: User) -> None:
    request = RequestFactory().get("/admin/")
    request.user = root
    checked = []
    for name, form in admin_forms(request):
        for field_name, field in form.base_fields.items():
            if not isinstance(field, NUMBER_FIELDS):
                continue
            posted: Any = (
                [FULL_WIDTH_2] if isinstance(field, forms.ModelMultipleChoiceField) else FULL_WIDTH_2
            )
            with pytest.raises(forms.ValidationError) as refused:
                field.clean(posted)
            assert refused.value.code == "non_ascii_digits", (name, field_name, refused.value)
            checked.append(f"{name}.{field_name}")
    assert {"ServedModel.tensor_parallel_size", "Job.created_by", "Group.permissions"} <= set(checked)
