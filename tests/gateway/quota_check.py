"""The admission's quota test without its reservation, for tests that look at the quota alone."""

from __future__ import annotations

from datetime import datetime

from accounts.models import ApiKey
from gateway.quota import refuse_over_quota, tokens_held_today


def check_token_quota(key: ApiKey, now: datetime, estimate: int = 1) -> tuple[int, int]:
    """Raise as an admission of a request that may cost ``estimate`` tokens would (no lock, nothing
    reserved); else the key's (used, reserved) tokens of ``now``'s day."""
    used, reserved = tokens_held_today(key.pk, now)
    refuse_over_quota(key.tokens_per_day, used, reserved, estimate, now)
    return used, reserved
