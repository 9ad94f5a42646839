"""Served models over the REST API: CRUD and strict validation (400 and nothing stored)."""

from __future__ import annotations

from typing import Any

import pytest
from deployments.models import DesiredState
from deployments.services import create_deployment, update_deployment
from django.core.exceptions import ValidationError as ModelValidationError
from inventory.models import Device, Host
from registry.api.serializers import ServedModelSerializer
from registry.models import MAX_CONTEXT_LENGTH, ServedModel
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

URL = "/api/v1/models/"
pytestmark = pytest.mark.django_db


def test_it_creates_lists_updates_and_deletes_a_model(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    created = admin_client.post(URL, model_payload, format="json")
    assert created.status_code == 201, created.data
    model = ServedModel.objects.get(name="llama-3-8b")
    assert model.tensor_parallel_size == 2
    assert model.engine_options == {"gpu_memory_utilization": 0.9}
    assert created.data["id"] == model.pk

    listed = admin_client.get(URL)
    assert listed.status_code == 200
    assert [row["name"] for row in listed.data["results"]] == ["llama-3-8b"]

    patched = admin_client.patch(f"{URL}{model.pk}/", {"slo_ttft_p99_ms": 250}, format="json")
    assert patched.status_code == 200, patched.data
    model.refresh_from_db()
    assert model.slo_ttft_p99_ms == 250

    replaced = admin_client.put(
        f"{URL}{model.pk}/", {**model_payload, "tensor_parallel_size": 4}, format="json"
    )
    assert replaced.status_code == 200, replaced.data
    model.refresh_from_db()
    assert model.tensor_parallel_size == 4

    deleted = admin_client.delete(f"{URL}{model.pk}/")
    assert deleted.status_code == 204
    assert not ServedModel.objects.filter(pk=model.pk).exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tensor_paralel_size": 2}, "tensor_paralel_size"),  # unknown (typo) field
        ({"id": 99}, "id"),  # read-only field
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 6}, "tensor_parallel_size"),
        ({"slo_ttft_p99_ms": 0}, "slo_ttft_p99_ms"),
        ({"slo_tbt_p99_ms": -5}, "slo_tbt_p99_ms"),
        ({"slo_attainment_pct": 0}, "slo_attainment_pct"),
        ({"slo_attainment_pct": 101}, "slo_attainment_pct"),
        ({"max_context_length": 0}, "max_context_length"),
        ({"max_context_length": 10**12}, "max_context_length"),  # SQLite would store it
        ({"max_context_length": 2**31}, "max_context_length"),  # beyond a PostgreSQL integer
        ({"name": "not a slug!"}, "name"),
        ({"source": "   "}, "source"),
        ({"dtype": "int3"}, "dtype"),
        ({"engine_options": [1, 2]}, "engine_options"),
        # PostgreSQL's jsonb cannot store \u0000: saving these was a 500 (DataError) there.
        ({"engine_options": {"extra_args": ["--x\x00"]}}, "engine_options"),
        ({"engine_options": {"aqua_options": {"nested": [{"k\x00": 1}]}}}, "engine_options"),
    ],
)
def test_it_rejects_invalid_models_with_field_errors_and_stores_nothing(
    admin_client: APIClient, model_payload: dict[str, Any], change: dict[str, Any], field: str
) -> None:
    response = admin_client.post(URL, {**model_payload, **change}, format="json")
    assert response.status_code == 400
    assert field in response.data
    assert ServedModel.objects.count() == 0


def test_it_reports_every_unknown_field_next_to_other_errors(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    payload = {**model_payload, "colour": "red", "tensor_parallel_size": 3}
    response = admin_client.post(URL, payload, format="json")
    assert response.status_code == 400
    assert set(response.data) == {"colour", "tensor_parallel_size"}
    assert ServedModel.objects.count() == 0


def test_it_rejects_a_duplicate_name(admin_client: APIClient, model_payload: dict[str, Any]) -> None:
    assert admin_client.post(URL, model_payload, format="json").status_code == 201
    again = admin_client.post(URL, {**model_payload, "source": "/models/other"}, format="json")
    assert again.status_code == 400
    assert again.json() == {"name": ["A model named 'llama-3-8b' already exists; choose another name."]}
    assert ServedModel.objects.count() == 1
    assert ServedModel.objects.get().source == model_payload["source"]


def test_it_refuses_renaming_a_model_to_a_taken_name_naming_it(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    admin_client.post(URL, model_payload, format="json")
    other = admin_client.post(URL, {**model_payload, "name": "other"}, format="json").data["id"]
    renamed = admin_client.patch(f"{URL}{other}/", {"name": "llama-3-8b"}, format="json")
    assert renamed.status_code == 400
    assert renamed.json() == {"name": ["A model named 'llama-3-8b' already exists; choose another name."]}
    assert ServedModel.objects.get(pk=other).name == "other"
    # A model keeps its own name through an edit.
    assert admin_client.patch(f"{URL}{other}/", {"name": "other"}, format="json").status_code == 200


def test_it_leaves_a_model_unchanged_when_an_update_is_invalid(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    model_id = admin_client.post(URL, model_payload, format="json").data["id"]
    response = admin_client.patch(
        f"{URL}{model_id}/", {"slo_ttft_p99_ms": 100, "tensor_parallel_size": 5}, format="json"
    )
    assert response.status_code == 400
    model = ServedModel.objects.get(pk=model_id)
    assert model.slo_ttft_p99_ms == 500.0
    assert model.tensor_parallel_size == 2


def test_it_accepts_every_power_of_two_tp_size(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    for index, size in enumerate([1, 2, 4, 8, 16]):
        payload = {**model_payload, "name": f"m{index}", "tensor_parallel_size": size}
        assert admin_client.post(URL, payload, format="json").status_code == 201
    assert sorted(ServedModel.objects.values_list("tensor_parallel_size", flat=True)) == [1, 2, 4, 8, 16]


def test_it_turns_a_duplicate_name_race_into_a_400(model_payload: dict[str, Any]) -> None:
    """The unique check passed for both of two simultaneous requests; the database catches the second."""
    ServedModel.objects.create(**model_payload)
    late = ServedModelSerializer(data={**model_payload, "source": "/other"})
    late.fields["name"].validators = []  # as if validated before the first row was committed
    assert late.is_valid(), late.errors
    with pytest.raises(ValidationError) as raised:
        late.save()
    assert raised.value.detail == {
        "name": ["A model named 'llama-3-8b' already exists; choose another name."]
    }
    assert ServedModel.objects.get().source == model_payload["source"]


def test_it_refuses_a_tensor_parallel_change_while_a_deployment_runs(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    model = ServedModel.objects.create(**model_payload)  # tensor_parallel_size=2
    host = Host.objects.create(name="host-a")
    devices = [
        Device.objects.create(host=host, index=i, uuid=f"host-a-{i}", name="L4", memory_total_bytes=24 << 30)
        for i in range(4)
    ]
    deployment = create_deployment(model, host, devices[:2])
    create_deployment(model, host, devices[2:], DesiredState.STOPPED)  # does not count
    for method, body in (
        ("patch", {"tensor_parallel_size": 4}),
        ("put", {**model_payload, "tensor_parallel_size": 1}),
    ):
        response = getattr(admin_client, method)(f"{URL}{model.pk}/", body, format="json")
        assert response.status_code == 400, method
        size = body["tensor_parallel_size"]
        assert response.data == {
            "tensor_parallel_size": [
                f"Deployment(s) {deployment.pk} run this model on 2 device(s); "
                f"stop them before changing its tensor-parallel size to {size}."
            ]
        }
        assert ServedModel.objects.get(pk=model.pk).tensor_parallel_size == 2

    update_deployment(deployment, desired_state=DesiredState.STOPPED)
    response = admin_client.patch(f"{URL}{model.pk}/", {"tensor_parallel_size": 4}, format="json")
    assert response.status_code == 200, response.data
    assert ServedModel.objects.get(pk=model.pk).tensor_parallel_size == 4


def test_it_bounds_the_context_length_below_what_any_database_column_holds(
    admin_client: APIClient, viewer_client: APIClient, model_payload: dict[str, Any]
) -> None:
    assert MAX_CONTEXT_LENGTH < 2**31 - 1  # a PostgreSQL integer column
    largest = admin_client.post(
        URL, {**model_payload, "max_context_length": MAX_CONTEXT_LENGTH}, format="json"
    )
    assert largest.status_code == 201, largest.data
    model = ServedModel.objects.get(pk=largest.data["id"])
    too_long = admin_client.patch(
        f"{URL}{model.pk}/", {"max_context_length": MAX_CONTEXT_LENGTH + 1}, format="json"
    )
    assert too_long.status_code == 400
    assert str(MAX_CONTEXT_LENGTH) in str(too_long.data["max_context_length"])
    refused = viewer_client.patch(f"{URL}{model.pk}/", {"max_context_length": 1024}, format="json")
    assert refused.status_code == 403
    model.refresh_from_db()
    assert model.max_context_length == MAX_CONTEXT_LENGTH
    # the model field carries the bound too: the admin's forms validate with it
    model.max_context_length = 10**12
    with pytest.raises(ModelValidationError) as raised:
        model.full_clean()
    assert set(raised.value.message_dict) == {"max_context_length"}


def test_engine_options_holding_a_lone_surrogate_are_refused_without_echoing_it(
    model_payload: dict[str, Any],
) -> None:
    """The model field's check (the Django admin's form; the API's parser refuses them first):
    jsonb cannot store one, and a message naming the unknown key could not be encoded."""
    model = ServedModel(**{**model_payload, "engine_options": {"\ud800": 1, "aqua_options": {"k": "\udc00"}}})
    with pytest.raises(ModelValidationError) as raised:
        model.full_clean()
    [message] = raised.value.message_dict["engine_options"]
    assert "lone surrogate" in message and "\ud800" not in message
