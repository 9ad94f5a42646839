"""A simulated host (the cluster view's demo hosts) runs no engine: a model deployed only there is
not served. /v1/models and the playground do not list it, and a request for it is a 404, not a
503 with Retry-After that a client would retry for ever. A model also deployed on a real host
is served as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from accounts.models import Role, User
from deployments.models import Deployment
from django.test import Client
from gateway.errors import GatewayError
from gateway.services import admit
from inventory.services import register_host
from registry.models import ServedModel

from tests.gateway.asgi_driver import CHAT, app_with, call, never

pytestmark = pytest.mark.usefixtures("gateway_data")


@pytest.fixture
def demo_host_models(gateway_data: dict[str, Any]) -> None:
    demo = register_host("demo-8xh100", "10.0.0.9")
    demo.simulated = True
    demo.save()
    only_simulated = ServedModel.objects.create(
        name="demo-only", source="/m", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    Deployment.objects.create(model=only_simulated, host=demo)
    Deployment.objects.create(model=gateway_data["model"], host=demo)  # "tiny" also runs on a real host


@pytest.mark.usefixtures("demo_host_models")
def test_a_model_deployed_only_on_simulated_hosts_is_not_listed_or_served(
    gateway_data: dict[str, Any],
) -> None:
    app, secret = app_with(never), gateway_data["secret"]
    listed = asyncio.run(call(app, "/v1/models", None, secret, method="GET")).json()["data"]
    assert [m["id"] for m in listed] == ["tiny"]
    assert asyncio.run(call(app, "/v1/models/demo-only", None, secret, method="GET")).status == 404
    refused = asyncio.run(call(app, "/v1/chat/completions", {**CHAT, "model": "demo-only"}, secret))
    assert refused.status == 404 and refused.json()["error"]["code"] == "model_not_found"
    with pytest.raises(GatewayError):
        admit(gateway_data["key"], "demo-only")
    assert admit(gateway_data["key"], "tiny").model_name == "tiny"


@pytest.mark.usefixtures("demo_host_models")
def test_the_playground_offers_only_served_models() -> None:
    User.objects.create_user(username="bob", password="bob-pw-7k2q", role=Role.VIEWER)
    client = Client()
    assert client.login(username="bob", password="bob-pw-7k2q")
    page = client.get("/playground/").content.decode()
    assert ">tiny<" in page and "demo-only" not in page


def test_a_playground_with_only_simulated_deployments_says_why_it_offers_no_model(
    gateway_data: dict[str, Any],
) -> None:
    """It said "No model is deployed yet." beside a GPU map showing the model deployed and
    running on the simulated host (`make run SIMULATE=1` with LOCAL_AGENT=0)."""
    demo = register_host("demo-8xh100", "10.0.0.9")
    demo.simulated = True
    demo.save()
    Deployment.objects.filter(model=gateway_data["model"]).delete()  # "tiny" ran on the real host
    for name in ("demo-b", "demo-a"):
        model = ServedModel.objects.create(
            name=name, source="/m", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
        )
        Deployment.objects.create(model=model, host=demo)
    User.objects.create_user(username="bob", password="bob-pw-7k2q", role=Role.VIEWER)
    client = Client()
    assert client.login(username="bob", password="bob-pw-7k2q")
    page = client.get("/playground/").content.decode()
    assert "No model is deployed yet" not in page
    assert "No model is served: demo-a, demo-b run only on simulated hosts" in page
    Deployment.objects.filter(model__name="demo-b").delete()
    page = client.get("/playground/").content.decode()
    assert "No model is served: demo-a runs only on simulated hosts" in page
