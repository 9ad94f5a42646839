"""Keyed-snapshot deltas: what changed between two snapshots, and a per-socket push throttle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """``{"set": {key: value}, "remove": [key]}`` for keys added, changed or gone; None if equal."""
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    removed = sorted(k for k in before if k not in after)
    if not changed and not removed:
        return None
    return {"set": changed, "remove": removed}


def push_interval_s() -> float:
    """Seconds between two pushes of one series: never below 1 (at most 1 Hz per series)."""
    return max(1.0, float(getattr(settings, "DASHBOARD_PUSH_INTERVAL_S", 1.0)))


@dataclass
class Throttle:
    """Remembers when each series was last pushed; ``ready`` says whether it may be pushed now."""

    interval_s: float = field(default_factory=push_interval_s)
    last: dict[str, float] = field(default_factory=dict)

    def ready(self, series: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        previous = self.last.get(series)
        if previous is not None and now - previous < self.interval_s:
            return False
        self.last[series] = now
        return True
