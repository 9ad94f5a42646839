"""A request still streaming when its model is deleted (its deployments stopped and deleted
first, as a model with deployments cannot be deleted) is billed all the same: usage keeps the
model's name without the link, as the rows already booked do (``Usage.model`` is SET_NULL)."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.services import create_api_key
from deployments.models import Deployment
from django.db import connection, transaction
from gateway.models import RequestSample, Usage
from gateway.quota import tokens_held_today
from gateway.services import Outcome, admit, finish
from registry.models import ServedModel

from tests.pg_locks import in_thread, wait_until_blocked


def outcome(prompt: int, completion: int, deployment_id: int | None = None) -> Outcome:
    return Outcome(
        deployment_id=deployment_id,
        stream=True,
        outcome="completed",
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=0.1,
        tbt_mean_s=0.01,
        tbt_max_s=0.02,
    )


def delete_model(model: ServedModel) -> None:
    Deployment.objects.filter(model=model).delete()
    model.delete()


def test_a_request_that_outlives_its_model_is_still_billed(gateway_data: dict[str, Any]) -> None:
    key, model = gateway_data["key"], gateway_data["model"]
    earlier = admit(gateway_data["key"], "tiny")
    finish(earlier, outcome(5, 1))  # booked while the model existed
    admissions = [admit(gateway_data["key"], "tiny") for _ in range(2)]
    delete_model(model)

    finish(admissions[0], outcome(10, 20))
    finish(admissions[1], outcome(1, 2))

    rows = list(
        Usage.objects.filter(key=key).values_list("model_id", "model_name", "requests", "prompt_tokens")
    )
    # The row booked before the delete lost its link; the late requests are added to it.
    assert rows == [(None, "tiny", 3, 16)]
    day = admissions[0].admitted_at
    assert day is not None and tokens_held_today(key.pk, day) == (6 + 33, 0)  # they count against the quota
    assert not RequestSample.objects.exists()  # latency samples go with their model


def test_usage_of_a_model_renamed_today_is_shown_under_the_name_last_used(
    gateway_data: dict[str, Any],
) -> None:
    """The day's row kept the first name: requests sent as "tiny-v2" were listed as "tiny"."""
    key, model = gateway_data["key"], gateway_data["model"]
    finish(admit(key, "tiny"), outcome(5, 1))
    ServedModel.objects.filter(pk=model.pk).update(name="tiny-v2")
    finish(admit(key, "tiny-v2"), outcome(2, 3))
    rows = list(
        Usage.objects.filter(key=key).values_list("model_id", "model_name", "requests", "prompt_tokens")
    )
    assert rows == [(model.pk, "tiny-v2", 2, 7)]


def test_late_usage_of_a_deleted_model_is_booked_under_its_name_at_admission(
    gateway_data: dict[str, Any],
) -> None:
    other_key = create_api_key(gateway_data["user"], "other").record
    admission = admit(gateway_data["key"], "tiny")
    model = gateway_data["model"]
    model.name = "tiny-v2"
    model.save()
    delete_model(model)
    ServedModel.objects.create(
        name="tiny", source="/m2", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )  # a new "tiny"

    finish(admission, outcome(3, 4))

    booked = Usage.objects.get()
    assert (booked.key_id, booked.model_id, booked.model_name) == (admission.key_id, None, "tiny")
    assert (booked.requests, booked.prompt_tokens, booked.completion_tokens) == (1, 3, 4)
    assert not Usage.objects.filter(key=other_key).exists()


def test_usage_of_a_key_deleted_meanwhile_is_dropped_without_an_error(gateway_data: dict[str, Any]) -> None:
    issued = create_api_key(gateway_data["user"], "short-lived")
    admission = admit(issued.record, "tiny")
    issued.record.delete()  # no usage yet: nothing protects it

    finish(admission, outcome(3, 4))

    assert not Usage.objects.exists()
    assert RequestSample.objects.filter(model=gateway_data["model"]).count() == 1


def test_a_request_that_outlives_its_deployment_keeps_its_latency_sample(
    gateway_data: dict[str, Any],
) -> None:
    admission = admit(gateway_data["key"], "tiny")
    deployment = gateway_data["deployments"][0]
    deployment_id = deployment.pk
    deployment.delete()

    finish(admission, outcome(3, 4, deployment_id=deployment_id))

    sample = RequestSample.objects.get()
    assert (sample.model_id, sample.deployment_id, sample.completion_tokens) == (admission.model_id, None, 4)
    assert Usage.objects.get().model_id == admission.model_id


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path")
def test_a_request_finishing_while_its_model_is_deleted_waits_and_is_billed(
    gateway_data: dict[str, Any],
) -> None:
    admission = admit(gateway_data["key"], "tiny")
    errors: list[str] = []
    with transaction.atomic():
        delete_model(gateway_data["model"])  # not committed yet: the model row is locked
        finishing = in_thread("finish", lambda: finish(admission, outcome(3, 4)), errors)
        wait_until_blocked()  # the usage insert waits for the model row's fate
    finishing.join(10)

    assert not finishing.is_alive() and errors == []
    booked = Usage.objects.get()
    assert (booked.model_id, booked.model_name, booked.requests, booked.prompt_tokens) == (None, "tiny", 1, 3)
    assert not RequestSample.objects.exists()
