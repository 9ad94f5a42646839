"""The dashboard's read endpoints: a model's gateway latencies and per-key usage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from accounts.models import Role, User
from accounts.services import create_api_key, issue_api_token
from django.utils import timezone
from gateway.models import RequestSample, Usage
from gateway.services import record_usage
from rest_framework.test import APIClient

USAGE = "/api/v1/gateway/usage/"


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
    # linearly interpolated, as serving.metrics.percentile
    assert body["summary"]["ttft_p50_s"] == pytest.approx(0.25)
    assert body["summary"]["ttft_p99_s"] == pytest.approx(0.397)
    assert body["summary"]["ttft_slo_s"] == 0.5 and body["summary"]["requests"] == 4
    assert client_of(gateway_data["user"]).get("/api/v1/gateway/latency/nope/").status_code == 404
    assert APIClient().get("/api/v1/gateway/latency/tiny/").status_code == 401


def test_usage_shows_own_keys_to_viewers_and_all_to_admins(gateway_data: dict[str, Any]) -> None:
    model = gateway_data["model"]
    bob = User.objects.create_user(username="bob", password="bob-pw-2k8d", role=Role.VIEWER)
    admin = User.objects.create_user(username="root", password="root-pw-5h1s", role=Role.ADMIN)
    record_usage(gateway_data["key"].pk, model.pk, 10, 5)
    record_usage(create_api_key(bob, "bobs").record.pk, model.pk, 3, 1)
    mine = client_of(gateway_data["user"]).get(USAGE).json()["results"]
    assert [(u["key_name"], u["prompt_tokens"], u["completion_tokens"]) for u in mine] == [("unit", 10, 5)]
    assert [u["key_name"] for u in client_of(bob).get(USAGE).json()["results"]] == ["bobs"]
    assert client_of(admin).get(USAGE).json()["count"] == 2
    assert APIClient().get(USAGE).status_code == 401


def test_usage_is_paginated_newest_day_first_beyond_a_thousand_rows(gateway_data: dict[str, Any]) -> None:
    key, model = gateway_data["key"], gateway_data["model"]
    other = create_api_key(gateway_data["user"], "second").record
    bob = User.objects.create_user(username="bob", password="bob-pw-2k8d", role=Role.VIEWER)
    first_day = datetime(2020, 1, 1, tzinfo=UTC)
    rows = [
        Usage(
            key=k,
            model=model,
            model_name=model.name,
            period_start=first_day + timedelta(days=day),
            requests=1,
            prompt_tokens=day,
            completion_tokens=0,
        )
        for day in range(520)
        for k in (key, other)
    ]
    Usage.objects.bulk_create(rows)  # 1040 rows: more than the old bare list's 1000
    record_usage(create_api_key(bob, "bobs").record.pk, model.pk, 3, 1)  # not alice's to see
    client = client_of(gateway_data["user"])

    seen: list[tuple[int, str]] = []
    url: str | None = f"{USAGE}?page_size=500"
    while url:
        response = client.get(url)
        assert response.status_code == 200
        page = response.json()
        assert page["count"] == 1040 and len(page["results"]) <= 500
        seen += [(u["prompt_tokens"], u["key_name"]) for u in page["results"]]  # tokens: the day
        url = page["next"]
    # Three pages, every row once: newest day first, then by key.
    assert seen == [(day, name) for day in reversed(range(520)) for name in ("unit", "second")]

    second = client.get(USAGE, {"page": 2, "page_size": 3}).json()
    assert [u["prompt_tokens"] for u in second["results"]] == [518, 517, 517]
    assert len(client.get(USAGE, {"page_size": 10_000}).json()["results"]) == 500  # at most 500
    assert client.get(USAGE, {"page": 999}).status_code == 404
