"""The model page's and the latency API's request counts say what they count: every request an
engine took, as the usage API counts them, those it refused (a 400, booked "failed") included, with
the failed ones and the ones the TTFT percentiles are over (those with a first token) counted apart.
The page said "Requests 2" beside a TTFT over the one served request."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from django.test import Client
from rest_framework.test import APIClient

from tests.gateway.asgi_driver import CHAT, app_with, call, chunk, final_usage, sse

REFUSAL = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}


def test_a_request_the_engine_refused_is_counted_as_failed_and_not_in_the_ttft(
    gateway_data: dict[str, Any],
) -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        body = sse(chunk("a", 5, 1), chunk("b", 5, 2), final_usage(5, 2))
        return httpx.Response(
            200, stream=httpx.ByteStream(body), headers={"content-type": "text/event-stream"}
        )

    def refusing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json=REFUSAL)

    secret, model = gateway_data["secret"], gateway_data["model"]
    streamed = {**CHAT, "stream": True}
    served = asyncio.run(call(app_with(upstream), "/v1/chat/completions", streamed, secret))
    refused = asyncio.run(call(app_with(refusing), "/v1/chat/completions", streamed, secret))
    assert (served.status, refused.status) == (200, 400)

    api = APIClient()
    api.force_authenticate(gateway_data["user"])
    usage = api.get("/api/v1/gateway/usage/").json()["results"]
    assert [row["requests"] for row in usage] == [2]  # the refused request is a request of the key's
    summary = api.get(f"/api/v1/gateway/latency/{model.name}/").json()["summary"]
    assert (summary["requests"], summary["failed"], summary["ttft_requests"]) == (2, 1, 1)

    page = Client()
    page.force_login(gateway_data["user"])
    html = page.get(f"/models/{model.pk}/").content.decode()
    block = html[html.index('id="gateway-latency"') :]
    assert '<dd id="gateway-requests">2, of which 1 failed (refused or cut off by the engine)</dd>' in block
    assert "<dt>TTFT p50 / p99, over the 1 request that got a first token</dt>" in block
