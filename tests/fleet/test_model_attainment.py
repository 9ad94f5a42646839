"""The model page's SLO attainment: which telemetry windows it judges, and on what."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dashboard.snapshots import attainment
from django.utils import timezone
from registry.models import ServedModel

MODEL = ServedModel(name="m", slo_ttft_p99_ms=500.0, slo_tbt_p99_ms=50.0)


def point(age_s: float, ttft_p99: float | None, tbt_p99: float | None) -> dict[str, Any]:
    return {
        "ts": (timezone.now() - timedelta(seconds=age_s)).isoformat(),
        "ttft_p99": ttft_p99,
        "tbt_p99": tbt_p99,
    }


def test_it_judges_a_window_of_decoding_only_on_its_time_between_tokens() -> None:
    points = [
        point(3, 0.2, 0.02),  # met
        point(2, None, 0.4),  # long answers decoding, no new request: 400 ms TBT misses 50 ms
        point(1, None, 0.01),  # met
    ]
    assert attainment(MODEL, points) == 66.7


def test_it_judges_a_window_of_single_token_answers_on_its_ttft() -> None:
    points = [point(2, 0.9, None), point(1, 0.1, None), point(0.5, None, None)]  # the last: idle
    assert attainment(MODEL, points) == 50.0


def test_it_forgets_windows_older_than_a_minute() -> None:
    # What the page's 10 minutes of history and its socket's last points have in common.
    points = [point(300, 2.0, 0.02), point(61, 2.0, 0.02), point(30, 0.1, 0.02), point(1, 0.1, 0.02)]
    assert attainment(MODEL, points) == 100.0
    assert attainment(MODEL, points[:2]) is None  # a deployment that stopped reporting
