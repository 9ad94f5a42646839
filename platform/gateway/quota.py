"""Per-key limits, kept in the database so that every ASGI process shares them.

- Requests per minute: the generic cell rate algorithm (GCRA) on one ``RateLimitState`` row per
  key, its theoretical arrival time (TAT). For a limit of ``rpm``, each admitted request moves the
  TAT to ``max(TAT, now) + T`` with ``T = 60/rpm`` seconds, and a request is admitted while the TAT
  is at most ``(rpm - 1) * T`` ahead of now: a rested key may send ``rpm`` requests at once, then
  one every ``T`` seconds, and has its full burst again at most a minute after its last request.
  One conditional UPDATE tests and moves the TAT, so concurrent processes together admit exactly
  what one would. The limit is exact where the old per-minute counters' estimate was not: every
  request that a log of the past 60 s would admit (fewer than ``rpm`` in it) is admitted, and
  within any ``s`` seconds a key gets fewer than ``rpm + s / T`` requests (so at most
  ``2 * rpm - 1`` within one minute: a burst, then the refill). A request over the limit is not
  counted and gets 429 with Retry-After: the seconds until the same request would be admitted.
  Times are whole nanoseconds, ``T`` rounded down: a key gains at most a microsecond per thousand
  requests. They are the database server's clock (`database_now`), one clock for every web host:
  with each host's own clock, two hosts whose clocks differ by more than the key's minute would
  each see the other's TAT as a clock step, and requests alternating between them were never
  refused. The database clock stepped back by more than 10 s restarts the key's state instead of
  refusing it for as long as the step (`_advance`).
- Tokens per day, counted as OpenAI counts its token limits: a request is admitted only if the
  most it may cost (its estimate, gateway/estimate.py: the prompt's estimated tokens plus ``n`` x
  ``max_tokens``, or the model's context without one) fits in what the key has left of the current
  UTC day (by the database clock at admission, as the rate limit): ``used + reserved + estimate <=
  tokens_per_day``, with ``used`` the day's booked ``Usage`` and ``reserved`` the estimates of the
  key's requests still in flight (``TokenReservation`` rows, gateway/reservations.py). The
  admission books its own estimate as a reservation under a lock on the key's row, so concurrent
  requests of one key, on any web host, together never reserve more than the quota; when the
  request ends its reservation is replaced by its real usage. So a key's day never exceeds its
  quota, except by a prompt longer than its estimate (4 characters a token) or a request that
  outlives its reservation (``GATEWAY_RESERVATION_TTL_S``). Refusals: a key whose day is used up,
  or whose used and reserved tokens leave too little, is 429 ``tokens_quota_exceeded`` with
  Retry-After (the next UTC midnight, and then, more than a minute away, ``x-should-retry:
  false``, so that OpenAI's SDKs do not retry into the same refusal; a few seconds when only
  requests in flight are in the way: their reservations free up as they end); a request whose
  estimate alone exceeds the whole quota could never be admitted and is 400
  ``request_too_large``, naming its output limit to lower.

An admitted request's response carries OpenAI's rate-limit headers (``RateLimits.headers``):
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``. Remaining requests are how many more
the key could send right now; remaining tokens are the quota less the day's usage and every
reservation in flight, this request's included. Requests reset when the key's full burst is
available again, tokens at the next UTC midnight. Resets are durations like ``59s`` or ``1m30s``.
A 429 for either limit carries them too, as OpenAI's do, for the key as the refusal leaves it (a
refused request holds nothing: no reservation, no place in the minute), with Retry-After and
``retry-after-ms``: the same wait to the millisecond, which OpenAI's SDKs prefer.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from accounts.models import ApiKey
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import BigIntegerField, Case, F, Field, Model, Q, QuerySet, Value, When
from django.db.models.functions import Greatest

from gateway.errors import GatewayError, bad_request, rate_limited
from gateway.models import RateLimitState, TokenReservation, Usage

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
# How far behind the time that set a key's TAT a request's time must be to count as the database
# clock stepping back (`_advance`): larger than the time between taking `now` and the UPDATE under
# load, when requests of one instant reach the UPDATE out of order.
CLOCK_STEP_MARGIN_NS = 10 * NS_PER_S
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def database_now() -> datetime:
    """The database server's current time (UTC, to the microsecond on PostgreSQL, the millisecond
    on SQLite): the rate limit's clock, the same for every web host that shares the database.

    PostgreSQL's ``clock_timestamp()`` is the time of the call, not of the transaction's start.
    SQLite's clock is the web process's own, which is one clock: SQLite means one host.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT clock_timestamp()")
            (now,) = cursor.fetchone()
            return now.astimezone(UTC)
        if connection.vendor == "sqlite":
            cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
            (text,) = cursor.fetchone()
            return datetime.fromisoformat(text).replace(tzinfo=UTC)
    raise NotImplementedError(f"database_now: no clock query for database vendor {connection.vendor!r}")


def day_start(now: datetime) -> datetime:
    """The start of ``now``'s UTC day: the period usage is aggregated over and quotas apply to."""
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def tokens_held_today(key_id: int, now: datetime) -> tuple[int, int]:
    """The key's tokens of ``now``'s UTC day: (used: booked usage, reserved: its requests in
    flight, their unexpired ``TokenReservation`` rows).

    One statement, so one snapshot: a request that ends books its usage before it drops its
    reservation (``services.finish``), and a snapshot sees it in one or both, never in neither.
    Written as SQL because it runs at every admission: the ORM's form of it (an ``ApiKey`` row
    annotated with two aggregate subqueries) took 3.5 ms to build on the 2-core test machine,
    three times what the rest of the reservation costs; this statement is portable SQL over the
    models' own table and column names."""
    day, at = (connection.ops.adapt_datetimefield_value(t) for t in (day_start(now), now))
    with connection.cursor() as cursor:
        cursor.execute(_tokens_held_sql(), [key_id, day, key_id, day, at])
        used, reserved = cursor.fetchone()
    return int(used), int(reserved)


@functools.cache
def _tokens_held_sql() -> str:
    """tokens_held_today's statement, over the models' table and column names (quoted)."""
    q = connection.ops.quote_name
    u = {f: q(_column(Usage, f)) for f in ("key", "period_start", "prompt_tokens", "completion_tokens")}
    r = {f: q(_column(TokenReservation, f)) for f in ("key", "tokens", "created_at", "expires_at")}
    used = f"COALESCE(SUM({u['prompt_tokens']} + {u['completion_tokens']}), 0)"
    return (
        f"SELECT (SELECT {used} FROM {q(Usage._meta.db_table)}"
        f" WHERE {u['key']} = %s AND {u['period_start']} = %s),"
        f" (SELECT COALESCE(SUM({r['tokens']}), 0) FROM {q(TokenReservation._meta.db_table)}"
        f" WHERE {r['key']} = %s AND {r['created_at']} >= %s AND {r['expires_at']} > %s)"
    )


def _column(model: type[Model], name: str) -> str:
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or not field.column:
        raise TypeError(f"{model.__name__}.{name} is not a column")
    return field.column


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


def _ms_past_midnight(now: datetime) -> int:
    """Milliseconds from ``now`` to the first whole millisecond after the next UTC midnight."""
    return (day_start(now) + timedelta(days=1) - now) // timedelta(milliseconds=1) + 1


def refuse_over_quota(
    quota: int, used: int, reserved: int, estimate: int, now: datetime, limit_field: str = "max_tokens"
) -> None:
    """Raise unless ``used + reserved + estimate <= quota``: 429 if the day is used up or too
    little is left of it, 400 if the estimate alone is over the quota (no retry would help)."""
    if used < quota and used + reserved + estimate <= quota:
        return
    numbers = f"{used} used and {reserved} reserved by requests in flight, of {quota} tokens today (UTC)"
    if used >= quota:
        raise _quota_exceeded(f"Token quota exceeded: {numbers}.", _ms_past_midnight(now))
    if estimate > quota:
        raise request_too_large(estimate, quota, limit_field)
    # Booked usage only grows until midnight; reservations free up as their requests end.
    wait_ms = (
        _ms_past_midnight(now)
        if used + estimate > quota
        else settings.GATEWAY_UNAVAILABLE_RETRY_AFTER_S * 1000
    )
    raise _quota_exceeded(
        f"Token quota exceeded: this request may use up to {estimate} tokens (its prompt and "
        f"n x {limit_field}); {numbers}.",
        wait_ms,
    )


# The longest wait a client's automatic retry is left to: OpenAI's SDKs wait up to a minute on
# Retry-After (some versions two), then retry at once with their own backoff instead, twice by
# default, into the same refusal.
SOON_MS = 60_000


def _quota_exceeded(message: str, retry_after_ms: int) -> GatewayError:
    """A 429 ``tokens_quota_exceeded``; one to wait longer than ``SOON_MS`` for (until midnight)
    says ``x-should-retry: false``: no retry before then can be admitted. Retry-After stays."""
    refused = rate_limited(message, retry_after_ms, "tokens_quota_exceeded")
    if retry_after_ms > SOON_MS:
        refused.retry = False
    return refused


def request_too_large(estimate: int, quota: int, limit_field: str) -> GatewayError:
    return bad_request(
        f"This request may use up to {estimate} tokens (its prompt and n x {limit_field}), more "
        f"than this key's whole daily quota of {quota} tokens: lower {limit_field} (or n), or "
        "shorten the prompt.",
        limit_field,
        "request_too_large",
    )


def rate_limits(
    key: ApiKey,
    now: datetime,
    tokens_held: int,
    requests_remaining: int,
    requests_reset_s: float,
    tokens_per_day: int | None = None,
) -> RateLimits:
    """The headers' figures; ``tokens_held``: the day's used and reserved tokens together;
    ``tokens_per_day``: the quota if not the key's (one just read under the key's lock)."""
    quota = key.tokens_per_day if tokens_per_day is None else tokens_per_day
    return RateLimits(
        requests_limit=key.requests_per_minute,
        requests_remaining=requests_remaining,
        requests_reset_s=requests_reset_s,
        tokens_limit=quota,
        tokens_remaining=max(0, quota - tokens_held),
        tokens_reset_s=_until_tomorrow(now),
    )


def take_request(key: ApiKey, now: datetime, tokens_held: int = 0) -> tuple[int, float]:
    """Admit and count one request of the key, or raise 429 if it is over the per-minute limit.

    ``now`` is the database's clock (`database_now`) for every request of the key, or a test's.
    ``tokens_held``: the day's used and reserved tokens without this request's, for the refusal's
    x-ratelimit-* headers (a refused request releases its reservation).
    Returns how many more requests the key could send right now, and the seconds until its full
    burst is available again.
    """
    limit, interval, tolerance, at = _gcra(key, now)
    state = RateLimitState.objects.filter(key=key)
    admitted = _advance(state, at, interval, tolerance)
    if not admitted and not state.exists():  # the key's first request
        try:
            with transaction.atomic():
                RateLimitState.objects.create(key=key, tat_ns=at + interval)
            admitted = True
        except IntegrityError:  # another request created it first
            admitted = _advance(state, at, interval, tolerance)
    tat = state.values_list("tat_ns", flat=True).get()
    if not admitted:
        limits = rate_limits(key, now, tokens_held, 0, (tat - at) / NS_PER_S)
        raise rate_limited(
            f"Rate limit exceeded: {limit} requests per minute.",
            -(-(tat - tolerance - at) // NS_PER_MS),  # when the TAT admits it, rounded up
            "rate_limit_exceeded",
            limits.headers(),
        )
    remaining = max(0, (at + tolerance - tat) // interval + 1)
    return remaining, max(0, tat - at) / NS_PER_S


def requests_left(key: ApiKey, now: datetime) -> tuple[int, float]:
    """What `take_request` would return had it not taken a request: how many the key could send
    right now, and the seconds until its full burst is back. Reads the TAT, changes nothing."""
    _, interval, tolerance, at = _gcra(key, now)
    tat = RateLimitState.objects.filter(key=key).values_list("tat_ns", flat=True).first() or at
    if not at <= tat <= at + tolerance + interval + CLOCK_STEP_MARGIN_NS:  # rested, or restarts
        tat = at  # (`_advance`)
    return max(0, (at + tolerance - tat) // interval + 1), (tat - at) / NS_PER_S


def _gcra(key: ApiKey, now: datetime) -> tuple[int, int, int, int]:
    """The key's limit, its emission interval T and tolerance (ns), and ``now`` in ns."""
    if now.tzinfo is None:
        raise ValueError(f"{now=} must be timezone-aware")
    limit = key.requests_per_minute
    interval = 60 * NS_PER_S // limit
    return limit, interval, (limit - 1) * interval, (now - EPOCH) // timedelta(microseconds=1) * 1000


def _advance(state: QuerySet[RateLimitState], at: int, interval: int, tolerance: int) -> bool:
    """Count a request at ``at`` (ns) if the key's TAT admits it: one UPDATE that tests and moves
    the TAT, atomic on SQLite and PostgreSQL.

    On one clock the TAT is never more than ``tolerance + interval`` ahead of the request that set
    it. One further ahead than that plus CLOCK_STEP_MARGIN_NS was set before the clock stepped
    back: the key is admitted and its TAT restarts from ``at``, instead of being refused for as
    long as the step. The margin keeps requests of one instant that reach the UPDATE out of order
    from counting as a step back. This needs one clock for every request of a key, the database's
    (`database_now`): with two clocks far enough apart, each would restart the TAT the other set
    and the key would never be refused."""
    skewed = at + tolerance + interval + CLOCK_STEP_MARGIN_NS
    tat = Case(
        When(tat_ns__gt=skewed, then=Value(at + interval)),
        default=Greatest(F("tat_ns"), Value(at, output_field=BigIntegerField())) + interval,
        output_field=BigIntegerField(),
    )
    admits = Q(tat_ns__lte=at + tolerance) | Q(tat_ns__gt=skewed)
    return state.filter(admits).update(tat_ns=tat) == 1
