"""Goodput: the highest request rate at which enough requests attain their SLO (DistServe, OSDI'24).

The search assumes attainment is non-increasing in the rate (more load never helps latency). Each
probe is a caller-supplied function, typically a seeded simulation at that rate, so the result is
deterministic whenever the probe is. When the assumption is violated (noise near the threshold) the
search still returns a rate that was measured to meet the target, but not necessarily the highest.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def goodput(
    attainment_at_rate: Callable[[float], float],
    target: float = 0.9,
    lo: float = 0.1,
    hi: float = 100.0,
    rel_tol: float = 0.01,
    max_expansions: int = 10,
) -> float:
    """Binary-search the highest rate whose attainment is >= target.

    The bracket is widened before bisecting: while attainment at `hi` still meets the target, `hi`
    doubles (at most `max_expansions` times; if it still meets the target the last `hi` is returned,
    a lower bound on the goodput); while attainment at `lo` misses it, `lo` halves (at most
    `max_expansions` times; if it still misses, 0.0 is returned). Bisection then keeps
    attainment(lo) >= target > attainment(hi) and stops when hi - lo <= rel_tol * lo.

    Args:
        attainment_at_rate: rate (requests/s) -> fraction of requests meeting their SLO.
        target: The attainment to meet, in (0, 1].
        lo: A rate expected to meet the target, > 0.
        hi: A rate expected to miss it, > lo.
        rel_tol: Relative width of the final bracket.
        max_expansions: Bound on the doublings of hi / halvings of lo.

    Returns:
        The highest rate measured to meet the target (within rel_tol), or 0.0 if none did.

    Raises:
        ValueError: Invalid bounds or tolerances.
    """
    if not 0.0 < target <= 1.0:
        raise ValueError(f"{target=} must be in (0, 1]")
    if not 0.0 < lo < hi or math.isinf(hi):
        raise ValueError(f"need 0 < lo < hi < inf, got {lo=}, {hi=}")
    if not rel_tol > 0:
        raise ValueError(f"{rel_tol=} must be positive")
    if max_expansions < 0:
        raise ValueError(f"{max_expansions=} must be >= 0")

    seen: dict[float, bool] = {}  # rate -> met; no rate is simulated twice

    def meets(rate: float) -> bool:
        if rate not in seen:
            value = attainment_at_rate(rate)
            seen[rate] = not math.isnan(value) and value >= target
        return seen[rate]

    for _ in range(max_expansions + 1):
        if meets(lo):
            break
        hi, lo = lo, lo / 2
    else:
        return 0.0
    for i in range(max_expansions + 1):
        if not meets(hi):
            break
        if i == max_expansions:
            return hi
        lo, hi = hi, hi * 2
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo
