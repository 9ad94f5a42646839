"""Binary search for the highest request rate that meets an SLA.

Bracketing: probe `initial_rate`; while it passes, double (up to `max_rate`); while it fails,
halve (down to `min_rate`). Bisection: probe the midpoint of the highest passing and the lowest
failing rate until (fail - pass) / fail <= rel_tol, or until `max_probes` are spent: then the
answer stands with the bracket it had (`rel_gap`), rather than the probes (minutes each on a real
engine) being thrown away. Running out while bracketing (no passing or no failing rate yet) is an
error. The answer is the highest passing rate probed.
Assumes latency grows with rate (true of one queue fed the same requests faster); if a probe
breaks that, bisection still returns a probed passing rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from serving.profiler.config import LatencySLA, ProfilerConfig, ProfilingCancelled, ProfilingError
from serving.profiler.probe import ProbeResult, RateProbe

ProgressFn = Callable[[float, str], None]  # (fraction in [0, 1], message)
CancelFn = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The outcome of a rate search.

    Attributes:
        max_rate: Highest probed rate that met the SLA.
        at_max: The probe at that rate.
        curve: Every probe, sorted by rate.
        capped: True if `max_rate` is the configured ceiling (the real maximum may be higher).
        rel_gap: (lowest failing - max_rate) / lowest failing when the search ended: at most
            `rel_tol`, unless `max_probes` ran out first; 0 when capped.
    """

    max_rate: float
    at_max: ProbeResult
    curve: tuple[ProbeResult, ...]
    capped: bool
    rel_gap: float = 0.0


class RateSearch:
    """Runs the search on one probe; reports progress in [start, end) of the caller's scale."""

    def __init__(
        self,
        probe: RateProbe,
        sla: LatencySLA,
        config: ProfilerConfig,
        progress: ProgressFn,
        should_cancel: CancelFn,
        span: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        self.probe = probe
        self.sla = sla
        self.config = config
        self.progress = progress
        self.should_cancel = should_cancel
        self.span = span
        self.results: dict[float, ProbeResult] = {}

    def _probe(self, rate: float) -> ProbeResult:
        if rate in self.results:
            return self.results[rate]
        if len(self.results) >= self.config.max_probes:
            raise ProfilingError(
                f"no answer within {self.config.max_probes} probes: no rate both met and missed the SLA yet "
                "(raise max_probes, or start nearer with initial_rate)"
            )
        if self.should_cancel():
            raise ProfilingCancelled(f"profiling cancelled after {len(self.results)} probes")
        result = self.probe.measure(rate)
        self.results[rate] = result
        verdict = "meets" if result.meets(self.sla) else "misses"
        self.progress(self._fraction(), f"{rate:.4g} req/s {verdict} the SLA ({len(self.results)} probes)")
        return result

    def _fraction(self) -> float:
        """Probes done over probes expected: bracketing so far + bisection steps still needed."""
        done = len(self.results)
        passing = [r for r, res in self.results.items() if res.meets(self.sla)]
        failing = [r for r, res in self.results.items() if not res.meets(self.sla)]
        if passing and failing and min(failing) > max(passing):
            lo, hi = max(passing), min(failing)
            left = max(0, math.ceil(math.log2(max((hi - lo) / (self.config.rel_tol * hi), 1.0))))
            expected = done + left
        else:
            expected = done + 1 + math.ceil(math.log2(1.0 / self.config.rel_tol))
        start, end = self.span
        return start + (end - start) * min(done / expected, 0.999)

    def run(self) -> SearchResult:
        """Search; raises ProfilingError if even `min_rate` misses the SLA."""
        cfg = self.config
        lo: float | None = None  # highest passing rate
        hi: float | None = None  # lowest failing rate
        rate = cfg.initial_rate
        if self._probe(rate).meets(self.sla):
            lo = rate
            while hi is None:
                if lo >= cfg.max_rate:
                    return self._result(lo, capped=True)
                rate = min(lo * 2, cfg.max_rate)
                if self._probe(rate).meets(self.sla):
                    lo = rate
                else:
                    hi = rate
        else:
            hi = rate
            while lo is None:
                if hi <= cfg.min_rate:
                    at = self.results[hi]
                    raise ProfilingError(
                        f"the SLA (P99 TTFT <= {self.sla.ttft_p99_s}s, P99 TBT <= {self.sla.tbt_p99_s}s) "
                        f"is missed even at {hi:.4g} req/s (P99 TTFT {at.ttft_p99_s:.4g}s, "
                        f"P99 TBT {at.tbt_p99_s:.4g}s)"
                    )
                rate = max(hi / 2, cfg.min_rate)
                if self._probe(rate).meets(self.sla):
                    lo = rate
                else:
                    hi = rate
        while (hi - lo) / hi > cfg.rel_tol:
            if len(self.results) >= cfg.max_probes:
                self.progress(
                    self._fraction(),
                    f"{cfg.max_probes} probes spent: the max rate is between {lo:.4g} and {hi:.4g} req/s",
                )
                break
            mid = (lo + hi) / 2
            if self._probe(mid).meets(self.sla):
                lo = mid
            else:
                hi = mid
        return self._result(lo, capped=False, rel_gap=(hi - lo) / hi)

    def _result(self, rate: float, capped: bool, rel_gap: float = 0.0) -> SearchResult:
        curve = tuple(self.results[r] for r in sorted(self.results))
        return SearchResult(rate, self.results[rate], curve, capped, rel_gap)
