"""Served models over the REST API: engine_options.sim_model / sim_gpu must name cost-model presets,
and max_context_length must fit a prompt and an answer (400 on the field, nothing stored)."""

from __future__ import annotations

from typing import Any

import pytest
from registry.models import MIN_CONTEXT_LENGTH, ServedModel
from rest_framework.test import APIClient

from serving.costmodel.config import MODEL_CONFIGS
from serving.costmodel.gpus import GPU_SPECS

URL = "/api/v1/models/"
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("option", "value", "known"),
    [
        ("sim_model", "gpt-17", MODEL_CONFIGS),
        ("sim_gpu", "rtx9090", GPU_SPECS),
        ("sim_gpu", "H100", GPU_SPECS),
    ],
)
def test_it_refuses_engine_options_naming_a_cost_model_preset_that_does_not_exist(
    admin_client: APIClient,
    viewer_client: APIClient,
    model_payload: dict[str, Any],
    option: str,
    value: str,
    known: dict[str, Any],
) -> None:
    bad = {"gpu_memory_utilization": 0.9, option: value}
    created = admin_client.post(URL, {**model_payload, "engine_options": bad}, format="json")
    assert created.status_code == 400
    assert set(created.data) == {"engine_options"}
    message = str(created.data["engine_options"][0])
    assert f"{option} must be a cost-model preset" in message and repr(value) in message
    assert all(name in message for name in known), message
    assert not ServedModel.objects.exists()

    model_created = admin_client.post(URL, model_payload, format="json")
    assert model_created.status_code == 201, model_created.data
    model = ServedModel.objects.get(pk=model_created.data["id"])
    edited = admin_client.patch(f"{URL}{model.pk}/", {"engine_options": bad}, format="json")
    assert edited.status_code == 400
    assert option in str(edited.data["engine_options"][0])
    assert viewer_client.patch(f"{URL}{model.pk}/", {"engine_options": bad}, format="json").status_code == 403
    model.refresh_from_db()
    assert model.engine_options == {"gpu_memory_utilization": 0.9}
    for name in known:  # every preset is accepted
        edited = admin_client.patch(f"{URL}{model.pk}/", {"engine_options": {option: name}}, format="json")
        assert edited.status_code == 200, edited.data
        model.refresh_from_db()
        assert model.engine_options == {option: name}


def test_it_refuses_a_context_too_short_for_a_prompt_and_an_answer(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    assert MIN_CONTEXT_LENGTH == 2
    too_short = admin_client.post(URL, {**model_payload, "max_context_length": 1}, format="json")
    assert too_short.status_code == 400
    assert set(too_short.data) == {"max_context_length"}
    assert "2" in str(too_short.data["max_context_length"][0])
    assert not ServedModel.objects.exists()

    shortest = admin_client.post(URL, {**model_payload, "max_context_length": 2}, format="json")
    assert shortest.status_code == 201, shortest.data
    model = ServedModel.objects.get(pk=shortest.data["id"])
    edited = admin_client.patch(f"{URL}{model.pk}/", {"max_context_length": 1}, format="json")
    assert edited.status_code == 400 and set(edited.data) == {"max_context_length"}
    model.refresh_from_db()
    assert model.max_context_length == 2
