"""Per-key request rate and token quota; usage aggregation per key, model and UTC day."""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from accounts.models import ApiKey
from accounts.services import create_api_key
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone
from gateway.errors import GatewayError
from gateway.models import RateLimitState, Usage
from gateway.quota import EPOCH, database_now, duration, take_request
from gateway.services import Outcome, admit, finish, record_usage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.quota_check import check_token_quota

NOW = datetime(2026, 3, 4, 10, 20, 45, tzinfo=UTC)


def taken_at(key: ApiKey, at: datetime) -> bool:
    """Whether the key's request at ``at`` is admitted."""
    try:
        take_request(key, at)
    except GatewayError as refused:
        assert refused.status == 429 and refused.code == "rate_limit_exceeded"
        return False
    return True


def retry_after(key: ApiKey, at: datetime) -> int | None:
    with pytest.raises(GatewayError) as caught:
        take_request(key, at)
    return caught.value.retry_after_s


def test_it_admits_one_request_a_minute_at_one_rpm(gateway_data: dict[str, Any]) -> None:
    key = create_api_key(gateway_data["user"], "trial", requests_per_minute=1).record
    assert taken_at(key, NOW)
    assert retry_after(key, NOW + timedelta(seconds=1)) == 59
    assert retry_after(key, NOW + timedelta(seconds=59, microseconds=999_999)) == 1
    # A minute after the first, not one and a half or two (the old per-minute counters' estimate).
    assert taken_at(key, NOW + timedelta(seconds=60))
    assert not taken_at(key, NOW + timedelta(seconds=119))
    assert taken_at(key, NOW + timedelta(seconds=120))
    assert taken_at(key, NOW + timedelta(minutes=10))


def test_it_admits_a_burst_of_the_limit_and_refuses_the_next_with_retry_after(
    gateway_data: dict[str, Any],
) -> None:
    key = create_api_key(gateway_data["user"], "rpm", requests_per_minute=3).record  # one per 20 s
    assert [taken_at(key, NOW) for _ in range(3)] == [True, True, True]
    tat = RateLimitState.objects.get(key=key).tat_ns
    # The next fits once the first of the burst is 20 s old: at 10:21:05.
    assert retry_after(key, NOW + timedelta(seconds=5)) == 15
    assert RateLimitState.objects.get(key=key).tat_ns == tat, "a refused request is not counted"
    assert not taken_at(key, NOW + timedelta(seconds=19, microseconds=999_999))
    assert taken_at(key, NOW + timedelta(seconds=20))  # admitted once Retry-After has passed
    assert retry_after(key, NOW + timedelta(seconds=20)) == 20
    # A minute after its last request the key has its full burst again, and no more.
    rested = NOW + timedelta(seconds=80)
    assert [taken_at(key, rested) for _ in range(4)] == [True, True, True, False]
    assert RateLimitState.objects.filter(key=key).count() == 1, "one row per key"


def test_a_clock_stepped_back_restarts_the_key_instead_of_refusing_it(gateway_data: dict[str, Any]) -> None:
    key = create_api_key(gateway_data["user"], "skew", requests_per_minute=600).record
    assert taken_at(key, NOW)
    # The database's clock stepped back an hour: the key has used 1 of 600, not 601.
    behind = NOW - timedelta(hours=1)
    assert taken_at(key, behind)
    assert RateLimitState.objects.get(key=key).tat_ns < NOW.timestamp() * 1e9, "restarted from its time"
    # Requests of one instant that reach the database out of order are not a step back.
    tight = create_api_key(gateway_data["user"], "tight", requests_per_minute=1).record
    assert taken_at(tight, NOW)
    assert not taken_at(tight, NOW - timedelta(seconds=1))
    assert not taken_at(tight, NOW - timedelta(seconds=9))


def test_web_hosts_with_skewed_clocks_share_one_limit(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_api_key(gateway_data["user"], "two-hosts", requests_per_minute=10).record  # one per 6 s
    # Requests alternate between web host A, two minutes ahead, and host B: each used to take the
    # other's TAT for a clock step and restart the key, so none was refused.
    host_clock = timezone.now
    skews = itertools.cycle([timedelta(minutes=2), timedelta()])
    monkeypatch.setattr(timezone, "now", lambda: host_clock() + next(skews))
    started = time.monotonic()
    admitted = 0
    for _ in range(40):
        try:
            admit(key, "tiny")
            admitted += 1
        except GatewayError as refused:
            assert refused.code == "rate_limit_exceeded"
    refilled = int((time.monotonic() - started) // 6)  # one more per 6 s the loop took
    assert 10 <= admitted <= 10 + refilled, f"{admitted} of 40 admitted"


def server_clock_ns() -> int:
    """The database server's clock, read apart from `database_now` (SQLite's is this process's)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (now,) = cursor.fetchone()
        return (now - EPOCH) // timedelta(microseconds=1) * 1000
    return time.time_ns()


def test_usage_is_booked_to_the_day_whose_quota_admitted_it(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admitted at 23:59:59 by the database clock; this web host's clock already says tomorrow
    # when the request finishes: its tokens count against the day that admitted it.
    key = gateway_data["key"]
    before_midnight = datetime(2026, 3, 4, 23, 59, 59, tzinfo=UTC)
    admission = admit(key, "tiny", before_midnight)
    host_clock = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: before_midnight + timedelta(seconds=5))
    finish(admission, Outcome(None, True, "completed", 30, 70, 0.1, 0.01, 0.02))
    monkeypatch.setattr(timezone, "now", host_clock)
    assert list(Usage.objects.filter(key=key).values_list("period_start", "prompt_tokens")) == [
        (datetime(2026, 3, 4, tzinfo=UTC), 30)
    ]
    assert check_token_quota(key, before_midnight) == (100, 0)  # used; its reservation released


def test_admission_without_a_time_takes_the_database_clock_not_the_hosts(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_api_key(gateway_data["user"], "db-clock", requests_per_minute=60).record  # one per s
    host_clock = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: host_clock() + timedelta(hours=12))  # this host's
    before = server_clock_ns() - 1_000_000  # SQLite's clock is whole milliseconds
    limits = admit(key, "tiny").limits
    after = server_clock_ns()
    at = RateLimitState.objects.get(key=key).tat_ns - 1_000_000_000  # its first request: TAT = at + 1 s
    assert before <= at <= after, (before, at, after)
    # The token quota's day and its reset are of the same clock.
    assert limits is not None

    def to_midnight(ns: int) -> float:
        moment = EPOCH + timedelta(microseconds=ns // 1000)
        return (
            moment.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1) - moment
        ).total_seconds()

    earliest, latest = to_midnight(after), to_midnight(before)
    assert math.floor(earliest) <= limits.tokens_reset_s <= math.ceil(latest)


def test_the_database_clock_names_a_database_it_cannot_read(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert abs(database_now() - timezone.now()) < timedelta(seconds=5)
    with monkeypatch.context() as patched, pytest.raises(NotImplementedError, match="vendor 'oracle'"):
        patched.setattr(connection, "vendor", "oracle")  # undone before the test database is flushed
        database_now()


def test_it_refuses_a_time_without_a_timezone(gateway_data: dict[str, Any]) -> None:
    naive = NOW.replace(tzinfo=None)
    with pytest.raises(ValueError, match=re.escape(f"now={naive!r} must be timezone-aware")):
        take_request(gateway_data["key"], naive)
    assert not RateLimitState.objects.exists()


def test_a_burst_at_a_minute_edge_is_not_renewed_in_the_next_minute(gateway_data: dict[str, Any]) -> None:
    key = create_api_key(gateway_data["user"], "edge", requests_per_minute=10).record  # one per 6 s
    edge = NOW.replace(second=59)
    for _ in range(10):
        take_request(key, edge)
    # A fixed window would admit 10 more at 10:21:01: twice the rate within two seconds.
    assert retry_after(key, edge + timedelta(seconds=2)) == 4
    # 31 s on, the burst has refilled by 5 (one per 6 s).
    half = edge + timedelta(seconds=31)
    assert [taken_at(key, half) for _ in range(6)] == [True] * 5 + [False]


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rpm=st.integers(1, 6),
    gaps_ms=st.lists(
        st.one_of(st.sampled_from([0, 0, 1, 10_000, 12_000, 20_000, 30_000, 60_000]), st.integers(0, 90_000)),
        max_size=40,
    ),
)
def test_it_admits_exactly_at_the_configured_rate(
    gateway_data: dict[str, Any], rpm: int, gaps_ms: list[int]
) -> None:
    key = create_api_key(
        gateway_data["user"], f"random-{uuid.uuid4().hex[:8]}", requests_per_minute=rpm
    ).record
    interval_ms = 60_000 // rpm  # exact for rpm 1..6
    admitted: list[int] = []  # ms since NOW
    at = 0
    for gap in gaps_ms:
        at += gap
        in_last_minute = sum(1 for t in admitted if t > at - 60_000)
        if taken_at(key, NOW + timedelta(milliseconds=at)):
            admitted.append(at)
        else:
            # Never stricter than an exact limiter: one that keeps the past minute's requests.
            assert in_last_minute >= rpm, f"refused at {at} ms with {in_last_minute} in the last minute"
    # Never faster than configured: a burst of rpm, then one per interval. So n requests span at
    # least (n - rpm) intervals; within one minute at most 2 * rpm - 1.
    for i, first in enumerate(admitted):
        for j in range(i + rpm, len(admitted)):
            assert admitted[j] - first >= (j - i + 1 - rpm) * interval_ms, (admitted, i, j)
        assert sum(1 for t in admitted if first <= t < first + 60_000) <= 2 * rpm - 1


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
    assert not RateLimitState.objects.filter(key=issued.record).exists()


def test_admission_lists_healthy_replicas_only(gateway_data: dict[str, Any]) -> None:
    first, second = gateway_data["deployments"]
    second.desired_state = "stopped"
    second.save()
    admission = admit(gateway_data["key"], "tiny")
    assert [t.deployment_id for t in admission.targets] == [first.pk]
    assert admission.model_name == "tiny"


def test_taking_a_request_tells_how_many_more_it_admits_now_and_when_the_burst_is_back(
    gateway_data: dict[str, Any],
) -> None:
    key = create_api_key(gateway_data["user"], "rpm", requests_per_minute=3).record  # one per 20 s
    assert [take_request(key, NOW) for _ in range(3)] == [(2, 20.0), (1, 40.0), (0, 60.0)]
    # 30 s on, one request's worth (and a half) has come back.
    assert take_request(key, NOW + timedelta(seconds=30)) == (0, 50.0)
    assert take_request(key, NOW + timedelta(seconds=70)) == (1, 30.0)
    assert take_request(key, NOW + timedelta(seconds=70)) == (0, 50.0)
    assert take_request(key, NOW + timedelta(minutes=5)) == (2, 20.0)


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
    body = {"model": "tiny", "prompt": "12345678", "max_tokens": 8}  # may cost 2 + 8 tokens
    headers = dict(admit(issued.record, "tiny", NOW, body=body).limits.headers())  # type: ignore[union-attr]
    assert headers[b"x-ratelimit-limit-requests"] == b"5"
    assert headers[b"x-ratelimit-remaining-requests"] == b"4"
    assert headers[b"x-ratelimit-reset-requests"] == b"12s"  # one request's worth at 5 per minute
    assert headers[b"x-ratelimit-limit-tokens"] == b"100"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"50"  # 40 used, 10 reserved by this request
    assert headers[b"x-ratelimit-reset-tokens"] == b"13h39m15s"  # to midnight UTC from 10:20:45


def refused_headers(key: ApiKey, at: datetime, max_tokens: int, code: str) -> dict[bytes, bytes]:
    """The headers of the 429 ``code`` that admitting a request of 2 + ``max_tokens`` tokens gets."""
    body = {"model": "tiny", "prompt": "12345678", "max_tokens": max_tokens}
    with pytest.raises(GatewayError) as caught:
        admit(key, "tiny", at, body=body)
    assert (caught.value.status, caught.value.code) == (429, code)
    return dict(caught.value.headers())


def test_a_rate_limit_refusal_carries_the_keys_limits_and_its_wait_in_ms(
    gateway_data: dict[str, Any],
) -> None:
    issued = create_api_key(gateway_data["user"], "h429", requests_per_minute=3, tokens_per_day=100)
    record_usage(issued.record.pk, gateway_data["model"].pk, 30, 10, NOW)
    body = {"model": "tiny", "prompt": "12345678", "max_tokens": 8}  # may cost 2 + 8 tokens
    for _ in range(3):  # the burst, one per 20 s: the key's TAT a minute ahead; 30 tokens reserved
        admit(issued.record, "tiny", NOW, body=body)
    at = NOW + timedelta(seconds=5, milliseconds=250, microseconds=400)
    headers = refused_headers(issued.record, at, 8, "rate_limit_exceeded")
    # The next fits at 10:21:05: in 14.7496 s, to the millisecond up; Retry-After in whole seconds.
    assert (headers[b"retry-after"], headers[b"retry-after-ms"]) == (b"15", b"14750")
    assert headers[b"x-ratelimit-limit-requests"] == b"3"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"] == b"55s"  # the full burst at 10:21:45
    assert headers[b"x-ratelimit-limit-tokens"] == b"100"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"30"  # 40 used, 30 reserved; its own released
    assert headers[b"x-ratelimit-reset-tokens"] == b"13h39m10s"


def test_a_token_quota_refusal_carries_the_keys_limits_and_its_wait_in_ms(
    gateway_data: dict[str, Any],
) -> None:
    soon = django_settings.GATEWAY_UNAVAILABLE_RETRY_AFTER_S
    issued = create_api_key(gateway_data["user"], "t429", requests_per_minute=5, tokens_per_day=100)
    record_usage(issued.record.pk, gateway_data["model"].pk, 30, 10, NOW)
    admit(issued.record, "tiny", NOW, body={"model": "tiny", "prompt": "12345678", "max_tokens": 8})
    # 52 more tokens would fit beside the 40 used but not beside the 10 in flight as well: soon.
    in_flight = refused_headers(issued.record, NOW + timedelta(seconds=3), 50, "tokens_quota_exceeded")
    assert (in_flight[b"retry-after"], in_flight[b"retry-after-ms"]) == (b"%d" % soon, b"%d000" % soon)
    assert in_flight[b"x-ratelimit-limit-requests"] == b"5"
    assert in_flight[b"x-ratelimit-remaining-requests"] == b"4", "a refused request is not counted"
    assert in_flight[b"x-ratelimit-reset-requests"] == b"9s"  # the first's 12 s, 3 s on
    assert in_flight[b"x-ratelimit-limit-tokens"] == b"100"
    assert in_flight[b"x-ratelimit-remaining-tokens"] == b"50"  # 40 used, 10 reserved
    assert in_flight[b"x-ratelimit-reset-tokens"] == b"13h39m12s"
    # 72 tokens do not fit beside the day's usage: not before midnight, 49151.75 s away.
    at = NOW + timedelta(seconds=3, milliseconds=250)
    tomorrow = refused_headers(issued.record, at, 70, "tokens_quota_exceeded")
    assert (tomorrow[b"retry-after"], tomorrow[b"retry-after-ms"]) == (b"49152", b"49151751")
    assert tomorrow[b"x-ratelimit-remaining-requests"] == b"4"
    assert tomorrow[b"x-ratelimit-remaining-tokens"] == b"50"
    assert tomorrow[b"x-ratelimit-reset-tokens"] == b"13h39m12s"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers: the PostgreSQL path")
def test_concurrent_requests_are_admitted_exactly_up_to_the_limit(gateway_data: dict[str, Any]) -> None:
    key = create_api_key(gateway_data["user"], "busy", requests_per_minute=5).record

    def race(at: datetime, callers: int = 16) -> int:
        start = threading.Barrier(callers)
        outcomes: list[bool] = []

        def call() -> None:
            try:
                start.wait(timeout=10)
                outcomes.append(taken_at(key, at))
            finally:
                connection.close()

        threads = [threading.Thread(target=call) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(outcomes) == callers
        return outcomes.count(True)

    assert race(NOW) == 5  # all of them the key's first request: one creates its row
    assert race(NOW + timedelta(seconds=30)) == 2  # two refilled, one per 12 s
    assert race(NOW + timedelta(seconds=90)) == 5  # rested: the full burst


def test_a_token_quota_refusal_until_midnight_tells_clients_not_to_retry(
    gateway_data: dict[str, Any],
) -> None:
    """OpenAI's SDKs retry a 429 (twice, by default) unless told not to; one refused until the
    day ends would only be refused again, while one that requests in flight stand in the way of,
    or one a minute before midnight, may be admitted on retry."""
    issued = create_api_key(gateway_data["user"], "noretry", requests_per_minute=50, tokens_per_day=100)
    record_usage(issued.record.pk, gateway_data["model"].pk, 30, 10, NOW)
    admit(issued.record, "tiny", NOW, body={"model": "tiny", "prompt": "12345678", "max_tokens": 8})
    in_flight = refused_headers(issued.record, NOW + timedelta(seconds=1), 50, "tokens_quota_exceeded")
    assert b"x-should-retry" not in in_flight
    tomorrow = refused_headers(issued.record, NOW + timedelta(seconds=2), 70, "tokens_quota_exceeded")
    assert tomorrow[b"x-should-retry"] == b"false"
    assert tomorrow[b"retry-after"] == b"49154"  # kept: when it will be admitted
    record_usage(issued.record.pk, gateway_data["model"].pk, 60, 0, NOW)  # the day used up
    spent = refused_headers(issued.record, NOW + timedelta(seconds=3), 1, "tokens_quota_exceeded")
    assert spent[b"x-should-retry"] == b"false" and spent[b"retry-after"] == b"49153"
    almost_midnight = NOW.replace(hour=23, minute=59, second=30)
    late = refused_headers(issued.record, almost_midnight, 1, "tokens_quota_exceeded")
    assert late[b"retry-after"] == b"31" and b"x-should-retry" not in late
