"""Arrival processes: seeded generators of sorted arrival times in [0, duration_s).

poisson   exponential inter-arrivals with mean 1 / rate.
gamma     gamma inter-arrivals with shape k and scale 1 / (rate * k), so the mean stays 1 / rate
          while the coefficient of variation is 1 / sqrt(k): k < 1 is burstier than Poisson, k = 1 is
          Poisson, k > 1 is more regular (the "burstiness" knob of vLLM's benchmark_serving.py).
on_off    a Poisson process whose rate is `rate` outside bursts and `burst_factor * rate` inside
          them; a burst of `burst_duration_s` starts at `burst_start_s` within every period of
          `period_s`. The piecewise-constant rate is sampled exactly by time rescaling: a unit-rate
          Poisson process on [0, Lambda(duration_s)) mapped through the inverse of the cumulative
          rate Lambda(t), which is periodic and piecewise linear, so each arrival is inverted in
          O(1) and the cost is linear in the arrivals whatever the number of periods.
All take a numpy Generator, so the caller's seed fixes the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

# float64 arrival times an array can hold at all (numpy: "Maximum allowed dimension exceeded")
_MAX_ARRIVALS = np.iinfo(np.intp).max // 8
# Smallest gamma shape (gap CV 10), as the control plane's profile jobs allow: below it numpy's gamma
# draws underflow to exactly 0 more and more often (about half of them at 1e-3), piling arrivals onto
# one instant, and near 1e-9 every draw is 0 and the arrival loop never leaves its window.
MIN_GAMMA_SHAPE = 0.01


def _check_rate_duration(rate: float, duration_s: float) -> None:
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"{rate=} must be a positive finite number")
    if not duration_s >= 0 or math.isinf(duration_s):
        raise ValueError(f"{duration_s=} must be >= 0 and finite")


def _check_expected(rate: float, span_s: float, expected: float) -> None:
    if expected > _MAX_ARRIVALS:
        raise ValueError(
            f"{rate=} over {span_s:g} s expects {expected:.3g} arrivals, more than an array can hold"
        )


def _renewal(gaps_fn: Callable[[int], np.ndarray], rate: float, start: float, end: float) -> np.ndarray:
    """Cumulative sums of gaps from `start`, kept while < end; draws in blocks for speed."""
    _check_expected(rate, end - start, (end - start) * rate)
    out: list[np.ndarray] = []
    t = start
    block = max(16, int((end - start) * rate * 1.1) + 16)
    while True:
        times = t + np.cumsum(gaps_fn(block))
        inside = times[times < end]
        out.append(inside)
        if len(inside) < len(times):
            break
        t = float(times[-1])
    return np.concatenate(out) if out else np.empty(0)


def _exponential_gaps(rng: np.random.Generator, rate: float) -> Callable[[int], np.ndarray]:
    return lambda n: rng.exponential(1.0 / rate, size=n)


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process of `rate` per second over [0, duration_s)."""
    _check_rate_duration(rate, duration_s)
    return _renewal(_exponential_gaps(rng, rate), rate, 0.0, duration_s)


def gamma_arrivals(rate: float, duration_s: float, shape: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times with gamma(shape, 1 / (rate * shape)) inter-arrivals over [0, duration_s).

    Args:
        rate: Mean arrival rate (requests/s).
        duration_s: Length of the window.
        shape: Burstiness; CV of the gaps is 1 / sqrt(shape). At least MIN_GAMMA_SHAPE.
        rng: Seeded generator.
    """
    _check_rate_duration(rate, duration_s)
    if not shape >= MIN_GAMMA_SHAPE or math.isinf(shape):
        raise ValueError(f"{shape=} must be a finite number >= {MIN_GAMMA_SHAPE} (gap CV <= 10)")
    scale = 1.0 / (rate * shape)
    return _renewal(lambda n: rng.gamma(shape, scale, size=n), rate, 0.0, duration_s)


def burst_windows(
    duration_s: float, burst_duration_s: float, period_s: float, burst_start_s: float
) -> list[tuple[float, float]]:
    """The [start, end) burst intervals within [0, duration_s), in time order."""
    windows: list[tuple[float, float]] = []
    k = 0
    while True:
        start = k * period_s + burst_start_s
        if start >= duration_s:
            return windows
        windows.append((start, min(start + burst_duration_s, duration_s)))
        k += 1


def on_off_arrivals(
    rate: float,
    duration_s: float,
    rng: np.random.Generator,
    burst_factor: float = 4.0,
    burst_duration_s: float = 10.0,
    period_s: float = 60.0,
    burst_start_s: float | None = None,
) -> np.ndarray:
    """Arrival times of a Poisson process with periodic bursts over [0, duration_s).

    Args:
        rate: Base rate (requests/s) outside bursts.
        duration_s: Length of the window.
        rng: Seeded generator.
        burst_factor: Rate multiplier inside a burst (k), >= 1.
        burst_duration_s: Length of each burst (d), in (0, period_s].
        period_s: One burst per period.
        burst_start_s: Offset of the burst within each period; default centres it,
            (period_s - burst_duration_s) / 2.
    """
    _check_rate_duration(rate, duration_s)
    if not burst_factor >= 1 or math.isinf(burst_factor):
        raise ValueError(f"{burst_factor=} must be >= 1 and finite")
    if not period_s > 0 or math.isinf(period_s):
        raise ValueError(f"{period_s=} must be a positive finite number")
    if not 0 < burst_duration_s <= period_s:
        raise ValueError(f"{burst_duration_s=} must be in (0, {period_s=}]")
    start = (period_s - burst_duration_s) / 2 if burst_start_s is None else burst_start_s
    if not 0 <= start <= period_s - burst_duration_s:
        raise ValueError(f"burst_start_s={start} must be in [0, period_s - burst_duration_s]")
    # The cumulative rate over one period: quiet until `start`, bursting for burst_duration_s,
    # quiet to the period's end. It was sampled segment by segment, two numpy draws per period
    # however few arrivals fell in them (measured: 64,000 periods at 0.01 req/s, 1,542 arrivals,
    # 1.1 s; a 1 ms period over a day hung), so the cost followed the periods, not the requests.
    loud = rate * burst_factor
    before = rate * start
    during = loud * burst_duration_s
    per_period = before + during + rate * (period_s - start - burst_duration_s)
    if math.isinf(duration_s / period_s):  # (math.floor of it raised OverflowError)
        raise ValueError(f"{period_s=} is too short for {duration_s=}: more periods than a float counts")
    whole = math.floor(duration_s / period_s)
    rest = duration_s - whole * period_s
    total = whole * per_period + (
        rate * min(rest, start)
        + loud * min(max(rest - start, 0.0), burst_duration_s)
        + rate * max(rest - start - burst_duration_s, 0.0)
    )
    _check_expected(rate, duration_s, total)
    u = _renewal(_exponential_gaps(rng, 1.0), 1.0, 0.0, total)
    q = np.floor(u / per_period)
    v = np.clip(u - q * per_period, 0.0, per_period)  # mass into its period
    offset = np.where(
        v < before,
        v / rate,
        np.where(
            v < before + during,
            start + (v - before) / loud,
            start + burst_duration_s + (v - before - during) / rate,
        ),
    )
    times = np.maximum.accumulate(q * period_s + offset) if len(u) else np.empty(0)
    return times[times < duration_s]  # (rounding may carry the last past the end)
