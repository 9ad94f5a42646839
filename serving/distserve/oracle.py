"""Simulated per-instance goodput of each phase (DistServe OSDI'24, Sec. 4), refinable on demand.

As in the paper, each phase is simulated on its own to find the goodput of one instance of a given
parallelism:
  prefill goodput  g_p(tp, pp): highest rate at which >= target of requests get TTFT <= ttft_s;
  decode goodput   g_d(tp, pp): highest rate at which >= target of requests get TPOT <= tpot_s,
                   requests arriving with their KV ready and pulled over the placement's KV link.
A prefill probe has no decode side to wait for, so it frees a request's KV at its first token; the
end-to-end run (serving/distserve/disagg.py) holds the KV until a decode instance pulls it.
The lanes of a pipelined instance are identical and get equal shares of its requests, so one lane
is simulated and its goodput multiplied by pp. Each goodput search is bracketed by the lane's
capacity bound (prefill: 1 / prefill time of a mean prompt; decode: the largest batch whose step
fits the TPOT, over TPOT x mean output), then bisected to `rel_tol`.

The bisection is resumable (`Bisection`): the searches refine a phase's bracket one probe at a time
and only as far as needed to rule placements in or out. Every bracket [lo, hi] holds the value a
full search would return, and a fully refined bracket returns exactly what
`serving.metrics.goodput` returns for the same probe, bounds and tolerance: the probes are the same
rates in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.costmodel import Link, PhaseCoeffs
from serving.distserve.decode import Handoff
from serving.distserve.disagg import run_decode, run_prefill
from serving.distserve.parallel import LaneModel, Parallelism, lane_model
from serving.metrics.latency import tpot
from serving.metrics.records import RequestRecord
from serving.workload.request import Request

Workload = Callable[[float], list[Request]]  # rate (req/s) -> requests


class Bisection:
    """`serving.metrics.goodput`'s search, stepped one probe at a time.

    After construction (which widens the bracket as `goodput` does) the value lies in
    [lo, hi]: lo was measured to meet the target and, unless `done`, hi to miss it, so the final
    value is < hi. `step()` makes one more probe; `done` is set once hi - lo <= rel_tol * lo
    (or when widening ended the search).
    """

    def __init__(
        self,
        meets: Callable[[float], bool],
        lo: float,
        hi: float,
        rel_tol: float,
        scale: float = 1.0,
        max_expansions: int = 10,
    ) -> None:
        if not 0.0 < lo < hi or math.isinf(hi) or not rel_tol > 0:
            raise ValueError(f"need 0 < lo < hi < inf and rel_tol > 0, got {lo=}, {hi=}, {rel_tol=}")
        seen: dict[float, bool] = {}  # rate -> met; no rate is probed twice

        probe = meets

        def memo(rate: float) -> bool:
            if rate not in seen:
                seen[rate] = probe(rate)
            return seen[rate]

        self.meets, self.rel_tol, self.scale = memo, rel_tol, scale
        self.done = False
        meets = memo
        for _ in range(max_expansions + 1):
            if meets(lo):
                break
            hi, lo = lo, lo / 2
        else:
            self.lo = self.hi = 0.0
            self.done = True
            return
        for i in range(max_expansions + 1):
            if not meets(hi):
                break
            if i == max_expansions:
                self.lo = self.hi = hi
                self.done = True
                return
            lo, hi = hi, hi * 2
        self.lo, self.hi = lo, hi
        self.done = hi - lo <= rel_tol * lo

    @classmethod
    def exact(cls, value: float) -> Bisection:
        """A finished search whose result is `value` (for oracles that know their goodputs)."""
        b = cls.__new__(cls)
        b.meets, b.rel_tol, b.scale = (lambda rate: rate <= value), 1.0, 1.0
        b.lo = b.hi = value
        b.done = True
        return b

    def step(self) -> None:
        """One probe at the midpoint (no-op when done)."""
        if self.done:
            return
        mid = (self.lo + self.hi) / 2
        if self.meets(mid):
            self.lo = mid
        else:
            self.hi = mid
        self.done = self.hi - self.lo <= self.rel_tol * self.lo

    def value(self) -> float:
        """The search's result (refining to the end first), times `scale`."""
        while not self.done:
            self.step()
        return self.lo * self.scale

    @property
    def lower(self) -> float:
        """A lower bound on `value()`."""
        return self.lo * self.scale

    @property
    def upper(self) -> float:
        """An upper bound on `value()` (strict unless done)."""
        return self.hi * self.scale


def largest_batch(decode: PhaseCoeffs, context: int, limit_s: float, max_batch: int | None = None) -> int:
    """The largest batch k >= 1 of requests of `context` tokens whose decode step,
    CostModel.decode_time([context] * k), is at most `limit_s` (1 if even two exceed it).

    The step time grows linearly in k, so this searches (doubling, then bisecting) instead of
    trying k = 2, 3, ... with a list of k contexts each: that scan was quadratic, and a loose TPOT
    (5 s: 0.9 s per decode bracket on llama-2-13b@a100, measured; 1000 s: hours, extrapolated).

    A step that does not grow with the batch (a fitted model whose per-token and per-sequence
    slopes are both 0: non-negative least squares gives that on flat samples) lets every batch
    meet the limit once two do; the batch is then bounded by something else, `max_batch` (e.g. the
    lane's running-request limit or its KV capacity), which is returned. It bounds only such steps:
    a growing step's batch is the limit's, however large.

    Raises:
        ValueError: The step does not grow with the batch, two requests meet the limit and no
            `max_batch` was given; or `max_batch` < 1.
    """

    def step(k: int) -> float:  # decode_time([context] * k), term for term
        return decode.a + decode.b * (context * k) + decode.c * k

    if max_batch is not None and max_batch < 1:
        raise ValueError(f"{max_batch=} must be >= 1")
    if not decode.b * context + decode.c > 0:
        if step(2) > limit_s:
            return 1
        if max_batch is None:
            raise ValueError(f"the decode step does not grow with the batch ({decode}); no batch bound")
        return max_batch
    if step(2) > limit_s:
        return 1
    lo, hi = 2, 4  # step(lo) <= limit_s < step(hi) once the doubling stops
    while step(hi) <= limit_s:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step(mid) <= limit_s:
            lo = mid
        else:
            hi = mid
    return lo


# Running requests per decode lane in the probes (run_decode's default).
DECODE_MAX_SEQS = 256

# (phase, tp, pp, stage link (None unpipelined), KV link (None for prefill)) -> bracket. The links
# themselves, not their names: two links of one name and different bandwidths shared a bracket.
OracleKey = tuple[str, int, int, Link | None, Link | None]


@dataclass
class PhaseOracle:
    """Simulated goodput of one instance of each phase, memoised by (phase, parallelism, links).

    Attributes:
        model, gpu: Cost-model preset names.
        workload: rate -> requests (seeded, so repeated probes agree); a fixed number of requests
            per probe keeps every probe equally cheap.
        ttft_s, tpot_s: The SLO.
        target: Fraction of requests that must meet it.
        rel_tol: Relative precision of each goodput search.
        prefill_max_tokens: Token budget of one prefill iteration.
        simulations: Probes simulated so far.
    """

    model: str
    gpu: str
    workload: Workload
    ttft_s: float
    tpot_s: float
    target: float = 0.9
    rel_tol: float = 0.03
    prefill_max_tokens: int = 1024
    simulations: int = 0
    _brackets: dict[OracleKey, Bisection] = field(default_factory=dict)
    _means: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "rel_tol"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name}={value} must be a positive finite number")
        if not 0 < self.target <= 1:
            raise ValueError(f"{self.target=} must be in (0, 1]")

    def prefill(self, par: Parallelism, stage_link: Link) -> float:
        """Goodput (req/s) of one prefill instance, fully refined."""
        return self.prefill_bracket(par, stage_link).value()

    def decode(self, par: Parallelism, stage_link: Link, kv_link: Link) -> float:
        """Goodput (req/s) of one decode instance pulling KV over `kv_link`, fully refined."""
        return self.decode_bracket(par, stage_link, kv_link).value()

    def _mean_lengths(self) -> tuple[float, float]:
        if self._means is None:
            reqs = self.workload(1.0)
            n = len(reqs)
            if n == 0:
                raise ValueError("the oracle's workload has no requests (at 1 req/s)")
            self._means = (sum(r.prompt_tokens for r in reqs) / n, sum(r.output_tokens for r in reqs) / n)
        return self._means

    def _meets(self, attainment: Callable[[float], float]) -> Callable[[float], bool]:
        def meets(rate: float) -> bool:
            self.simulations += 1
            value = attainment(rate)
            return not math.isnan(value) and value >= self.target

        return meets

    def prefill_bracket(self, par: Parallelism, stage_link: Link) -> Bisection:
        """The (possibly partly refined) goodput search of one prefill instance."""
        key: OracleKey = ("prefill", par.tp, par.pp, stage_link if par.pp > 1 else None, None)
        if key not in self._brackets:
            lane = lane_model(self.model, self.gpu, par, stage_link)
            one = LaneModel(lane.cost, 1, lane.kv_tokens_per_lane)

            def att(rate: float) -> float:
                recs = run_prefill(self.workload(rate), one, 1, self.prefill_max_tokens)
                ok = sum(1 for r in recs if r.token_times and r.token_times[0] - r.arrival <= self.ttft_s)
                return ok / len(recs) if recs else 1.0

            # Bracket from the capacity bound: 1 / prefill time of a mean prompt.
            hi = 1.2 / lane.cost.prefill_time([round(self._mean_lengths()[0])])
            self._brackets[key] = Bisection(self._meets(att), hi / 4, hi, self.rel_tol, lane.lanes)
        return self._brackets[key]

    def decode_bracket(self, par: Parallelism, stage_link: Link, kv_link: Link) -> Bisection:
        """The (possibly partly refined) goodput search of one decode instance."""
        key: OracleKey = ("decode", par.tp, par.pp, stage_link if par.pp > 1 else None, kv_link)
        if key not in self._brackets:
            lane = lane_model(self.model, self.gpu, par, stage_link)
            one = LaneModel(lane.cost, 1, lane.kv_tokens_per_lane)

            def att(rate: float) -> float:
                recs = [
                    RequestRecord(r.req_id, r.arrival, r.prompt_tokens, r.output_tokens, [r.arrival])
                    for r in self.workload(rate)
                ]
                run_decode([Handoff(r.arrival, r) for r in recs], one, 1, kv_link, DECODE_MAX_SEQS)
                ok = sum(1 for r in recs if (tpot(r) or 0.0) <= self.tpot_s)
                return ok / len(recs) if recs else 1.0

            # Bracket from the capacity bound: the largest batch whose decode step fits the TPOT.
            prompt, output = self._mean_lengths()
            context = round(prompt + output / 2)
            # A flat (fitted) step bounds no batch: the lane's running-request and KV limits do.
            bound = max(1, min(DECODE_MAX_SEQS, lane.kv_tokens_per_lane // max(1, context)))
            batch = largest_batch(lane.cost.decode, context, self.tpot_s, bound)
            hi = 1.2 * batch / (self.tpot_s * output)
            self._brackets[key] = Bisection(self._meets(att), hi / 4, hi, self.rel_tol, lane.lanes)
        return self._brackets[key]
