"""Per-key request rate and token quota; usage aggregation per key, model and UTC day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from accounts.services import create_api_key
from gateway.errors import GatewayError
from gateway.models import RateWindow, Usage
from gateway.quota import check_token_quota, duration, take_request
from gateway.services import admit, record_usage

NOW = datetime(2026, 3, 4, 10, 20, 45, tzinfo=UTC)


def test_it_refuses_the_request_over_the_per_minute_limit_with_retry_after(
    gateway_data: dict[str, Any],
) -> None:
    key = create_api_key(gateway_data["user"], "rpm", requests_per_minute=3).record
    for _ in range(3):
        take_request(key, NOW)
    with pytest.raises(GatewayError) as caught:
        take_request(key, NOW + timedelta(seconds=5))  # 10:20:50
    assert caught.value.status == 429 and caught.value.code == "rate_limit_exceeded"
    # Not before 10:21:20: 10 s left in this minute, then until this minute's 3 weigh at most 2.
    assert caught.value.retry_after_s == 30
    assert RateWindow.objects.get(key=key).count == 3, "a refused request is not counted"
    with pytest.raises(GatewayError):
        take_request(key, NOW + timedelta(seconds=5 + 29))
    take_request(key, NOW + timedelta(seconds=5 + 30))  # admitted once Retry-After has passed
    take_request(key, NOW + timedelta(minutes=3))
    assert RateWindow.objects.filter(key=key).count() == 1, "windows older than the previous are deleted"


def test_a_burst_at_a_minute_edge_still_counts_in_the_next_minute(gateway_data: dict[str, Any]) -> None:
    key = create_api_key(gateway_data["user"], "edge", requests_per_minute=10).record
    edge = NOW.replace(second=59)
    for _ in range(10):
        take_request(key, edge)
    # A fixed window would admit 10 more at 10:21:01: twice the rate within two seconds.
    admitted = 0
    for _ in range(10):
        try:
            take_request(key, edge + timedelta(seconds=2))
            admitted += 1
        except GatewayError as refused:
            assert refused.retry_after_s is not None and refused.retry_after_s > 0
    assert admitted == 0
    # Half a minute on, half of the previous minute's 10 still counts: 5 more fit.
    half = edge + timedelta(seconds=31)  # 10:21:30
    for _ in range(5):
        take_request(key, half)
    with pytest.raises(GatewayError):
        take_request(key, half)


def test_it_refuses_requests_once_the_days_tokens_are_used(gateway_data: dict[str, Any]) -> None:
    key = create_api_key(gateway_data["user"], "tpd", tokens_per_day=100).record
    model = gateway_data["model"]
    record_usage(key.pk, model.pk, 30, 60, NOW)
    check_token_quota(key, NOW)  # 90 of 100: allowed
    record_usage(key.pk, model.pk, 5, 5, NOW)
    with pytest.raises(GatewayError) as caught:
        check_token_quota(key, NOW)
    assert caught.value.status == 429 and caught.value.code == "tokens_quota_exceeded"
    midnight = datetime(2026, 3, 5, tzinfo=UTC)
    assert caught.value.retry_after_s == int((midnight - NOW).total_seconds()) + 1
    check_token_quota(key, midnight)  # a new day


def test_usage_is_aggregated_per_key_model_and_day(gateway_data: dict[str, Any]) -> None:
    key, model = gateway_data["key"], gateway_data["model"]
    record_usage(key.pk, model.pk, 10, 1, NOW)
    record_usage(key.pk, model.pk, 20, 2, NOW + timedelta(hours=1))
    record_usage(key.pk, model.pk, 40, 4, NOW + timedelta(days=1))
    rows = list(
        Usage.objects.filter(key=key).values_list(
            "period_start", "requests", "prompt_tokens", "completion_tokens"
        )
    )
    assert rows == [
        (datetime(2026, 3, 4, tzinfo=UTC), 2, 30, 3),
        (datetime(2026, 3, 5, tzinfo=UTC), 1, 40, 4),
    ]


def test_admission_checks_the_quota_before_taking_a_request(gateway_data: dict[str, Any]) -> None:
    issued = create_api_key(gateway_data["user"], "both", requests_per_minute=1, tokens_per_day=10)
    record_usage(issued.record.pk, gateway_data["model"].pk, 10, 0, NOW)
    with pytest.raises(GatewayError) as caught:
        admit(issued.record, "tiny", NOW)
    assert caught.value.code == "tokens_quota_exceeded"
    assert not RateWindow.objects.filter(key=issued.record).exists()


def test_admission_lists_healthy_replicas_only(gateway_data: dict[str, Any]) -> None:
    first, second = gateway_data["deployments"]
    second.desired_state = "stopped"
    second.save()
    admission = admit(gateway_data["key"], "tiny")
    assert [t.deployment_id for t in admission.targets] == [first.pk]
    assert admission.model_name == "tiny"


def test_taking_a_request_tells_how_many_more_the_minute_admits_and_when_it_resets(
    gateway_data: dict[str, Any],
) -> None:
    key = create_api_key(gateway_data["user"], "rpm", requests_per_minute=3).record
    taken = [take_request(key, NOW) for _ in range(3)]  # 45 s into the minute
    assert [remaining for remaining, _ in taken] == [2, 1, 0]
    assert taken[0][1] == pytest.approx(75.0)  # this minute stops counting at 10:22:00


def test_durations_read_like_openais() -> None:
    assert [duration(s) for s in (0, 0.2, 59, 60, 90.5, 86399)] == [
        "0s",
        "1s",
        "59s",
        "1m0s",
        "1m31s",
        "23h59m59s",
    ]


def test_an_admission_carries_the_keys_limits_as_headers(gateway_data: dict[str, Any]) -> None:
    issued = create_api_key(gateway_data["user"], "h", requests_per_minute=5, tokens_per_day=100)
    record_usage(issued.record.pk, gateway_data["model"].pk, 30, 10, NOW)
    headers = dict(admit(issued.record, "tiny", NOW).limits.headers())  # type: ignore[union-attr]
    assert headers[b"x-ratelimit-limit-requests"] == b"5"
    assert headers[b"x-ratelimit-remaining-requests"] == b"4"
    assert headers[b"x-ratelimit-limit-tokens"] == b"100"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"60"
    assert headers[b"x-ratelimit-reset-tokens"] == b"13h39m15s"  # to midnight UTC from 10:20:45
