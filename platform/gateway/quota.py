"""Per-key limits, kept in the database so that every ASGI process shares them.

- Requests per minute: a sliding window, estimated from one-minute counters per key
  (``RateWindow``, incremented with one atomic UPDATE): the current minute's count plus the
  previous minute's, weighted by the part of the sliding minute that still overlaps it. Unlike a
  fixed window, a burst at the end of one minute is still counted at the start of the next, so a
  key cannot get twice its rate across a window edge. A request over the limit is not counted and
  gets 429 with Retry-After: the seconds until the same request would be admitted.
- Tokens per day: the key's ``Usage`` rows of the current UTC day. A request is refused once the
  day's total reached the quota; the request that crosses it is served in full (its size is only
  known when it ends), so a key can overshoot by one response.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from accounts.models import ApiKey
from django.db import IntegrityError, transaction
from django.db.models import F, Sum

from gateway.errors import rate_limited
from gateway.models import RateWindow, Usage

MINUTE = timedelta(minutes=1)


def day_start(now: datetime) -> datetime:
    """The start of ``now``'s UTC day: the period usage is aggregated over and quotas apply to."""
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def tokens_used_today(key: ApiKey, now: datetime) -> int:
    totals = Usage.objects.filter(key=key, period_start=day_start(now)).aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens")
    )
    return int(totals["p"] or 0) + int(totals["c"] or 0)


def check_token_quota(key: ApiKey, now: datetime) -> None:
    """Raise 429 if the key used its tokens for today."""
    used = tokens_used_today(key, now)
    if used >= key.tokens_per_day:
        retry = day_start(now) + timedelta(days=1) - now
        raise rate_limited(
            f"Token quota exceeded: {used} of {key.tokens_per_day} tokens used today (UTC).",
            int(retry.total_seconds()) + 1,
            "tokens_quota_exceeded",
        )


def take_request(key: ApiKey, now: datetime) -> None:
    """Count one request in the key's sliding minute, or raise 429 if that would exceed the limit."""
    window = now.replace(second=0, microsecond=0)
    previous = window - MINUTE
    rows = RateWindow.objects.filter(key=key, window_start=window)
    if not rows.update(count=F("count") + 1):
        try:
            with transaction.atomic():
                RateWindow.objects.create(key=key, window_start=window, count=1)
            RateWindow.objects.filter(key=key, window_start__lt=previous).delete()  # no longer needed
        except IntegrityError:  # another request created it first
            rows.update(count=F("count") + 1)
    counts = dict(
        RateWindow.objects.filter(key=key, window_start__in=(previous, window)).values_list(
            "window_start", "count"
        )
    )
    current, before = counts.get(window, 0), counts.get(previous, 0)
    elapsed = (now - window) / MINUTE
    limit = key.requests_per_minute
    if before * (1.0 - elapsed) + current > limit + 1e-9:  # (float noise at exact boundaries)
        rows.update(count=F("count") - 1)
        raise rate_limited(
            f"Rate limit exceeded: {limit} requests per minute.",
            max(1, math.ceil(_seconds_until_admitted(before, current - 1, limit, elapsed))),
            "rate_limit_exceeded",
        )


def _seconds_until_admitted(before: int, current: int, limit: int, elapsed: float) -> float:
    """When one more request fits: ``before`` and ``current`` count the previous and current
    minutes without it, ``elapsed`` is the fraction of the current minute gone."""
    if current + 1 <= limit:  # later in this minute, as the previous minute's weight fades
        return max(0.0, 1.0 - (limit - current - 1) / before - elapsed) * 60.0
    # Only in the next minute, once this minute's weight (now the previous one) has faded enough.
    return (1.0 - elapsed) * 60.0 + max(0.0, 1.0 - (limit - 1) / current) * 60.0
