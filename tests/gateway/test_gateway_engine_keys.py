"""The gateway reaches each engine with its deployment's engine key (deployments/engine_keys.py).

Engines are started with that key (vLLM's VLLM_API_KEY) so that nobody who reaches a GPU host uses
them past the gateway's end-user keys and quotas; a request the gateway relays without it would be
refused by the engine (401), so every chat through the gateway would fail.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from deployments.engine_keys import engine_api_key
from gateway.models import RequestSample

from tests.gateway.asgi_driver import CHAT, app_with, call

pytestmark = pytest.mark.usefixtures("gateway_data")


def test_each_replica_gets_its_own_deployments_engine_key(gateway_data: dict[str, Any]) -> None:
    a, b = gateway_data["deployments"]
    keys = {"replica-a": engine_api_key(a.pk), "replica-b": engine_api_key(b.pk)}
    sent: list[tuple[str, str | None]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        """As vLLM with VLLM_API_KEY: anything but its own key is a 401. Replica a fails its
        first request (a 503 before any byte), so the gateway fails over to b: both are asked."""
        sent.append((request.url.host, request.headers.get("authorization")))
        if request.headers.get("authorization") != f"Bearer {keys[request.url.host]}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if sent == [("replica-a", f"Bearer {keys['replica-a']}")]:
            return httpx.Response(503, json={"error": "warming up"})
        return httpx.Response(
            200, json={"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        )

    app = app_with(engine)
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == 200, result.body
    assert [host for host, _ in sent] == ["replica-a", "replica-b"]
    assert all(auth == f"Bearer {keys[host]}" for host, auth in sent)
    # The end user's key never reaches an engine.
    assert all(gateway_data["secret"] not in (auth or "") for _, auth in sent)
    assert RequestSample.objects.filter(outcome="completed").count() == 1


def test_engine_keys_differ_per_deployment_and_follow_the_secret_key(
    gateway_data: dict[str, Any], settings: Any
) -> None:
    a, b = gateway_data["deployments"]
    first = engine_api_key(a.pk)
    assert first != engine_api_key(b.pk) and len(first) == 64
    settings.SECRET_KEY = "another-secret-key-" + "x" * 50
    assert engine_api_key(a.pk) != first


@pytest.mark.parametrize("status", [401, 403])
def test_an_engine_refusing_the_gateways_key_is_a_failed_replica_not_the_clients_401(
    gateway_data: dict[str, Any], status: int
) -> None:
    """An engine still running with the key of an earlier SECRET_KEY (until its restart) refuses
    the gateway's: that is the replica's failure (the next one is tried, then a 503 to retry),
    never an invalid key of the client's, which OpenAI's SDKs raise as AuthenticationError and
    do not retry."""
    asked: list[str] = []

    def refusing(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        return httpx.Response(status, json={"error": "Unauthorized"})

    result = asyncio.run(call(app_with(refusing), "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert sorted(asked) == ["replica-a", "replica-b"]
    assert result.status == 503 and int(result.headers[b"retry-after"]) > 0
    assert b"www-authenticate" not in result.headers
    error = result.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "upstream_failed")

    def first_refuses(request: httpx.Request) -> httpx.Response:
        if not asked:
            asked.append(request.url.host)
            return httpx.Response(status, json={"error": "Unauthorized"})
        return httpx.Response(
            200, json={"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        )

    asked.clear()
    served = asyncio.run(call(app_with(first_refuses), "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert served.status == 200, served.body
