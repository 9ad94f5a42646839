"""The dashboard's read endpoints: a model's gateway latencies and per-key usage."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from accounts.models import Role, User
from accounts.services import create_api_key, issue_api_token
from django.utils import timezone
from gateway.models import RequestSample
from gateway.services import record_usage
from rest_framework.test import APIClient


def client_of(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user, 't').plaintext}")
    return client


def test_latency_lists_recent_requests_with_percentiles_and_slo(gateway_data: dict[str, Any]) -> None:
    model, now = gateway_data["model"], timezone.now()
    for i, ttft in enumerate([0.1, 0.2, 0.3, 0.4]):
        RequestSample.objects.create(
            model=model,
            ts=now - timedelta(seconds=10 - i),
            stream=True,
            outcome="completed",
            ttft_s=ttft,
            tbt_mean_s=0.01 * (i + 1),
            tbt_max_s=0.05,
        )
    RequestSample.objects.create(
        model=model, ts=now - timedelta(hours=2), stream=True, outcome="completed", ttft_s=9
    )
    response = client_of(gateway_data["user"]).get("/api/v1/gateway/latency/tiny/")
    assert response.status_code == 200
    body = response.json()
    assert [r["ttft_s"] for r in body["requests"]] == [0.1, 0.2, 0.3, 0.4], "oldest first, window applied"
    assert body["summary"]["ttft_p50_s"] == 0.3 and body["summary"]["ttft_p99_s"] == 0.4
    assert body["summary"]["ttft_slo_s"] == 0.5 and body["summary"]["requests"] == 4
    assert client_of(gateway_data["user"]).get("/api/v1/gateway/latency/nope/").status_code == 404
    assert APIClient().get("/api/v1/gateway/latency/tiny/").status_code == 401


def test_usage_shows_own_keys_to_viewers_and_all_to_admins(gateway_data: dict[str, Any]) -> None:
    model = gateway_data["model"]
    bob = User.objects.create_user(username="bob", password="bob-pw-2k8d", role=Role.VIEWER)
    admin = User.objects.create_user(username="root", password="root-pw-5h1s", role=Role.ADMIN)
    record_usage(gateway_data["key"].pk, model.pk, 10, 5)
    record_usage(create_api_key(bob, "bobs").record.pk, model.pk, 3, 1)
    mine = client_of(gateway_data["user"]).get("/api/v1/gateway/usage/").json()
    assert [(u["key_name"], u["prompt_tokens"], u["completion_tokens"]) for u in mine] == [("unit", 10, 5)]
    assert [u["key_name"] for u in client_of(bob).get("/api/v1/gateway/usage/").json()] == ["bobs"]
    assert len(client_of(admin).get("/api/v1/gateway/usage/").json()) == 2
