"""Token reservations: what an admitted request holds against its key's daily quota until it ends.

- ``reserve_tokens``: at admission, under a lock on the key's row, check that the request's
  estimate fits beside the day's usage and the key's other reservations, and book it.
- ``release_reservation``: when the request ends, whatever its outcome (``services.finish`` after
  its usage is booked, or the proxy when no engine took the request); idempotent.
- ``prune_token_reservations``: delete the expired ones, left by a web process that died
  mid-request (run with the telemetry retention, agents/retention.py). Expired ones no longer
  count even before they are pruned (``quota.tokens_held_today``).

Why a row lock: each admission reads the key's used and reserved tokens and then inserts; two
admissions that read before either inserted would both pass. ``SELECT ... FOR UPDATE`` on the
``ApiKey`` row makes the admissions of one key take turns on PostgreSQL (keys do not wait for one
another), and under READ COMMITTED the totals read after the lock is granted include the
reservation of the admission that held it. SQLite takes its write lock at BEGIN (the settings'
``transaction_mode`` IMMEDIATE), which serializes every writer.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from accounts.models import ApiKey
from django.conf import settings
from django.db import transaction

from gateway.errors import GatewayError, unauthorized
from gateway.estimate import TokenEstimate
from gateway.models import TokenReservation
from gateway.quota import (
    database_now,
    rate_limits,
    refuse_over_quota,
    requests_left,
    tokens_held_today,
)


def reserve_tokens(key: ApiKey, now: datetime, estimate: TokenEstimate) -> tuple[int, int]:
    """Reserve the request's ``estimate`` against the key's quota of ``now``'s UTC day.

    ``now`` is the database clock (the quota's, `quota.database_now`). The quota is the locked
    row's: one an admin just changed applies at once.

    Returns:
        (the reservation's id, the day's used and reserved tokens with this reservation).
    Raises:
        GatewayError: 429 over the quota (with the key's x-ratelimit-* headers), 400 an estimate
            over the whole quota (`refuse_over_quota`), 401 a key deleted since it was authenticated.
    """
    with transaction.atomic():
        quota = (
            ApiKey.objects.select_for_update()
            .filter(pk=key.pk)
            .values_list("tokens_per_day", flat=True)
            .first()
        )
        if quota is None:
            raise unauthorized("Invalid or revoked API key.")
        used, reserved = tokens_held_today(key.pk, now)  # read after the lock: a fresh snapshot
        try:
            refuse_over_quota(quota, used, reserved, estimate.total, now, estimate.limit_field)
        except GatewayError as refused:
            if refused.status == 429:  # the key's limits as it stands, this request not counted
                limits = rate_limits(key, now, used + reserved, *requests_left(key, now), quota)
                refused.extra_headers = limits.headers()
            raise
        ttl = timedelta(seconds=settings.GATEWAY_RESERVATION_TTL_S)
        reservation = TokenReservation.objects.create(
            key_id=key.pk, tokens=estimate.total, created_at=now, expires_at=now + ttl
        )
    return reservation.pk, used + reserved + estimate.total


def release_reservation(reservation_id: int) -> None:
    """Drop a request's reservation (nothing if it is gone already)."""
    TokenReservation.objects.filter(pk=reservation_id).delete()


def prune_token_reservations(now: datetime | None = None) -> int:
    """Delete reservations that expired (``now``: the database clock by default); returns how many."""
    deleted, _ = TokenReservation.objects.filter(expires_at__lte=now or database_now()).delete()
    return deleted
