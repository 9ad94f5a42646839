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

An admitted request's response carries OpenAI's rate-limit headers (``RateLimits.headers``):
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``. Remaining requests are what the sliding
minute still admits after this one; requests reset when both counted minutes have passed, tokens
at the next UTC midnight. Resets are durations like ``59s`` or ``1m30s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RateLimits:
    """Where an admitted request leaves its key's limits."""

    requests_limit: int
    requests_remaining: int
    requests_reset_s: float
    tokens_limit: int
    tokens_remaining: int
    tokens_reset_s: float

    def headers(self) -> list[tuple[bytes, bytes]]:
        values = {
            "limit-requests": str(self.requests_limit),
            "remaining-requests": str(self.requests_remaining),
            "reset-requests": duration(self.requests_reset_s),
            "limit-tokens": str(self.tokens_limit),
            "remaining-tokens": str(self.tokens_remaining),
            "reset-tokens": duration(self.tokens_reset_s),
        }
        return [(f"x-ratelimit-{name}".encode(), value.encode()) for name, value in values.items()]


def duration(seconds: float) -> str:
    """``59s``, ``1m30s``, ``23h59m59s``: whole seconds, rounded up."""
    total = max(0, math.ceil(seconds))
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    return (f"{h}h" if h else "") + (f"{m}m" if h or m else "") + f"{sec}s"


def _until_tomorrow(now: datetime) -> float:
    return (day_start(now) + timedelta(days=1) - now).total_seconds()


def check_token_quota(key: ApiKey, now: datetime) -> int:
    """Raise 429 if the key used its tokens for today; else the tokens it used today."""
    used = tokens_used_today(key, now)
    if used >= key.tokens_per_day:
        raise rate_limited(
            f"Token quota exceeded: {used} of {key.tokens_per_day} tokens used today (UTC).",
            int(_until_tomorrow(now)) + 1,
            "tokens_quota_exceeded",
        )
    return used


def rate_limits(
    key: ApiKey, now: datetime, tokens_used: int, requests_remaining: int, requests_reset_s: float
) -> RateLimits:
    return RateLimits(
        requests_limit=key.requests_per_minute,
        requests_remaining=requests_remaining,
        requests_reset_s=requests_reset_s,
        tokens_limit=key.tokens_per_day,
        tokens_remaining=max(0, key.tokens_per_day - tokens_used),
        tokens_reset_s=_until_tomorrow(now),
    )


def take_request(key: ApiKey, now: datetime) -> tuple[int, float]:
    """Count one request in the key's sliding minute, or raise 429 if that would exceed the limit.

    Returns how many more requests the sliding minute admits now, and the seconds until it
    counts none of the requests made so far.
    """
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
    remaining = max(0, math.floor(limit - (before * (1.0 - elapsed) + current) + 1e-9))
    return remaining, (2.0 - elapsed) * 60.0  # the current minute stops counting a minute after it ends


def _seconds_until_admitted(before: int, current: int, limit: int, elapsed: float) -> float:
    """When one more request fits: ``before`` and ``current`` count the previous and current
    minutes without it, ``elapsed`` is the fraction of the current minute gone."""
    if current + 1 <= limit:  # later in this minute, as the previous minute's weight fades
        return max(0.0, 1.0 - (limit - current - 1) / before - elapsed) * 60.0
    # Only in the next minute, once this minute's weight (now the previous one) has faded enough.
    return (1.0 - elapsed) * 60.0 + max(0.0, 1.0 - (limit - 1) / current) * 60.0
