"""Numbers in API input take ASCII digits only: Python's int() and float() read any Unicode decimal
digit, so "\uff12" (full-width 2) or "\u0662" (Arabic-Indic 2) was 2, a device id so written found
device 2, and a page size so written was taken. Each is a 400 naming the field (core.serializers)."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import ApiKey
from deployments.models import Deployment
from inventory.models import Device, Host
from jobs.models import Job
from registry.models import ServedModel
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

FULL_WIDTH_2 = "\uff12"
ARABIC_INDIC_2 = "\u0662"


def refused(response: Any, field: str) -> list[str]:
    assert response.status_code == 400, (response.status_code, response.content)
    errors = response.json()
    assert field in errors, errors
    return [str(e) for e in errors[field]]


@pytest.mark.parametrize("digit", [FULL_WIDTH_2, ARABIC_INDIC_2])
def test_a_model_field_given_non_ascii_digits_is_a_400_naming_it(
    admin_client: APIClient, model_payload: dict[str, Any], digit: str
) -> None:
    for field in ("tensor_parallel_size", "slo_ttft_p99_ms"):
        answer = admin_client.post("/api/v1/models/", {**model_payload, field: digit}, format="json")
        assert any("ASCII digits" in e for e in refused(answer, field))
    assert not ServedModel.objects.exists()
    assert (
        admin_client.post("/api/v1/models/", {**model_payload, "tensor_parallel_size": "2"}).status_code
        == 201
    )


def test_a_device_id_given_non_ascii_digits_is_a_400_not_that_device(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    ServedModel.objects.create(**{**model_payload, "tensor_parallel_size": 1})
    host = Host.objects.create(name="host-a")
    device = Device.objects.create(host=host, index=0, uuid="a-0", name="L4", memory_total_bytes=24 << 30)
    digits = str(device.pk).translate(
        str.maketrans("0123456789", "".join(chr(0xFF10 + i) for i in range(10)))
    )
    body = {"model": "llama-3-8b", "host": "host-a", "devices": [digits]}
    assert refused(admin_client.post("/api/v1/deployments/", body, format="json"), "devices")
    assert not Deployment.objects.exists()


def test_a_quota_and_a_job_parameter_given_non_ascii_digits_are_400s(
    admin_client: APIClient, viewer_client: APIClient
) -> None:
    body = {"name": "k", "requests_per_minute": FULL_WIDTH_2 + "0"}
    assert refused(admin_client.post("/api/v1/api-keys/", body, format="json"), "requests_per_minute")
    assert not ApiKey.objects.exists()
    job = {"kind": "noop", "params": {"steps": FULL_WIDTH_2, "delay_s": "0"}}
    errors = admin_client.post("/api/v1/jobs/", job, format="json")
    assert errors.status_code == 400 and set(errors.json()["params"]) == {"steps"}
    assert not Job.objects.exists()


def test_query_parameters_given_non_ascii_digits_are_400s_naming_them(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    for i in range(3):
        Job.objects.create(kind="noop", celery_id=f"c{i}")
    assert refused(admin_client.get(f"/api/v1/jobs/?page_size={FULL_WIDTH_2}"), "page_size")
    assert refused(admin_client.get(f"/api/v1/jobs/?page_size=2&page={FULL_WIDTH_2}"), "page")
    assert (
        len(admin_client.get("/api/v1/jobs/?page_size=2&page=2").json()["results"]) == 1
    )  # ASCII: as before
    ServedModel.objects.create(**model_payload)
    latency = "/api/v1/gateway/latency/llama-3-8b/"
    assert refused(admin_client.get(f"{latency}?window_s=6{FULL_WIDTH_2}0"), "window_s")
    assert admin_client.get(f"{latency}?window_s=620").status_code == 200
    host = Host.objects.create(name="host-a")
    since = "1" + FULL_WIDTH_2 * 9
    assert refused(admin_client.get(f"/api/v1/hosts/{host.pk}/telemetry/?since={since}"), "since")


def test_a_primary_key_in_the_path_takes_ascii_digits_only(
    admin_client: APIClient, model_payload: dict[str, Any]
) -> None:
    model = ServedModel.objects.create(**model_payload)
    key = admin_client.post("/api/v1/api-keys/", {"name": "k"}, format="json").json()["id"]
    full_width = str.maketrans("0123456789", "".join(chr(0xFF10 + i) for i in range(10)))
    for path in (f"/api/v1/models/{model.pk}/", f"/api/v1/api-keys/{key}/"):
        assert admin_client.get(path).status_code == 200
        prefix, pk = path.rstrip("/").rsplit("/", 1)
        for other in (pk.translate(full_width), f"%20{pk}", f"{pk}%20"):
            answer = admin_client.get(f"{prefix}/{other}/")  # was the row of that number
            assert answer.status_code == 404 and answer.json() == {"detail": "Not found."}, other
    revoke = admin_client.post(f"/api/v1/api-keys/{str(key).translate(full_width)}/revoke/")
    assert revoke.status_code == 404
    assert not ApiKey.objects.get(pk=key).revoked
