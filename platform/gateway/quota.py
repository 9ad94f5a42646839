"""Per-key limits, kept in the database so that every ASGI process shares them.

- Requests per minute: a fixed one-minute window per key (``RateWindow``), incremented with one
  atomic UPDATE; a request over the limit is not counted and gets 429 with the seconds left in
  the window as Retry-After. A fixed window admits up to twice the rate across a window edge.
- Tokens per day: the key's ``Usage`` rows of the current UTC day. A request is refused once the
  day's total reached the quota; the request that crosses it is served in full (its size is only
  known when it ends), so a key can overshoot by one response.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from accounts.models import ApiKey
from django.db import IntegrityError, transaction
from django.db.models import F, Sum

from gateway.errors import rate_limited
from gateway.models import RateWindow, Usage


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
    """Count one request in the key's current minute, or raise 429 if that would exceed the limit."""
    window = now.replace(second=0, microsecond=0)
    rows = RateWindow.objects.filter(key=key, window_start=window)
    if not rows.update(count=F("count") + 1):
        try:
            with transaction.atomic():
                RateWindow.objects.create(key=key, window_start=window, count=1)
            RateWindow.objects.filter(key=key, window_start__lt=window).delete()  # past windows
        except IntegrityError:  # another request created it first
            rows.update(count=F("count") + 1)
    count = rows.values_list("count", flat=True).first() or 0
    if count > key.requests_per_minute:
        rows.update(count=F("count") - 1)
        retry = window + timedelta(minutes=1) - now
        raise rate_limited(
            f"Rate limit exceeded: {key.requests_per_minute} requests per minute.",
            int(retry.total_seconds()) + 1,
            "rate_limit_exceeded",
        )
