"""A completion request for a model /v1/models does not list is a 404 ``model_not_found`` (as
/v1/models/{model} answers), not a 503 a client would retry forever; a listed model that has no
healthy replica right now stays a 503 with Retry-After."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from deployments.models import Deployment, DesiredState
from gateway.models import RateLimitState, Usage
from inventory.models import HostStatus
from registry.models import ServedModel

from tests.gateway.asgi_driver import CHAT, app_with, call, never


def completion_and_retrieve(secret: str, model: str) -> tuple[Any, Any, list[str]]:
    app = app_with(never)  # no upstream request is expected in any of these
    chat = asyncio.run(call(app, "/v1/chat/completions", {**CHAT, "model": model}, secret))
    retrieve = asyncio.run(call(app, f"/v1/models/{model}", None, secret, method="GET"))
    listed = asyncio.run(call(app, "/v1/models", None, secret, method="GET")).json()["data"]
    return chat, retrieve, [m["id"] for m in listed]


def test_a_registered_model_without_deployments_is_404_like_its_retrieve(
    gateway_data: dict[str, Any],
) -> None:
    ServedModel.objects.create(
        name="idle", source="/m", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    chat, retrieve, listed = completion_and_retrieve(gateway_data["secret"], "idle")
    assert "idle" not in listed and retrieve.status == 404
    assert chat.status == 404 and chat.json() == retrieve.json()
    assert chat.json()["error"]["code"] == "model_not_found" and b"retry-after" not in chat.headers
    assert not Usage.objects.exists()
    assert not RateLimitState.objects.exists(), "a refused request takes nothing from the rate limit"


def test_a_model_whose_deployments_are_all_stopped_is_404(gateway_data: dict[str, Any]) -> None:
    # The replicas still report running (the agent has not stopped them yet): what counts is
    # whether a deployment should run, as for /v1/models.
    Deployment.objects.filter(model=gateway_data["model"]).update(desired_state=DesiredState.STOPPED)
    chat, retrieve, listed = completion_and_retrieve(gateway_data["secret"], "tiny")
    assert listed == [] and retrieve.status == 404
    assert chat.status == 404 and chat.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("stopped", [0, 1])  # how many of the two deployments are stopped
def test_a_listed_model_without_a_healthy_replica_stays_503_with_retry_after(
    gateway_data: dict[str, Any], stopped: int
) -> None:
    for deployment in gateway_data["deployments"][:stopped]:
        deployment.desired_state = DesiredState.STOPPED
        deployment.save()
    gateway_data["host"].status = HostStatus.OFFLINE  # no replica can take a request
    gateway_data["host"].save()
    chat, retrieve, listed = completion_and_retrieve(gateway_data["secret"], "tiny")
    assert listed == ["tiny"] and retrieve.status == 200
    assert chat.status == 503 and int(chat.headers[b"retry-after"]) > 0
    assert chat.json()["error"]["code"] == "no_healthy_replica"
