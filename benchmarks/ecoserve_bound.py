"""An upper bound on any scheduler's goodput from GPU work alone (benchmarks/ecoserve.py).

Goodput counts a rate as sustained when at least `served_share` (90%) of requests meet their SLO,
so a scheduler may give up on the rest; the cheapest way to do that is to drop the requests that
cost the most GPU time and serve nothing of them. The others still need their work done. By the
cost model (CostModel.iteration_time), a prompt of P tokens costs at least b_p * P + c_p * P in
prefill (the quadratic term at its smallest, one token per chunk), and its o output tokens o - 1
decode steps over contexts P .. P + o - 2, each d_b * context + d_c. Every iteration also pays
the fixed cost d_a once, and decodes at most max_num_seqs requests, so the decode steps need at
least (their number / max_num_seqs) iterations: each step carries d_a / max_num_seqs.

A rate is out of reach when that work, per second of the run's arrivals, exceeds one GPU-second.
This is a steady-state bound: it ignores the KV cache (which binds FCFS first on this workload),
queueing and every latency target, and assumes perfect knowledge of which requests to drop, so
real schedulers stay well below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from serving.costmodel import CostModel
from serving.metrics import goodput
from serving.workload.request import Request


def gpu_seconds(cost: CostModel, r: Request, max_num_seqs: int) -> float:
    """The least GPU time serving `r` needs (module docstring)."""
    p, d = cost.prefill, cost.decode
    prompt, steps = r.prompt_tokens, max(r.output_tokens - 1, 0)
    prefill = p.b * prompt + p.c * prompt
    contexts = steps * prompt + steps * (steps - 1) / 2  # sum of P + j for j in 0 .. steps - 1
    return prefill + d.b * contexts + (d.c + d.a / max_num_seqs) * steps


def gpu_load(
    cost: CostModel, reqs: Sequence[Request], duration_s: float, served_share: float, max_num_seqs: int
) -> float:
    """GPU-seconds per second that serving the cheapest `served_share` of `reqs` (rounded up: at
    least that share) needs at least."""
    work = sorted(gpu_seconds(cost, r, max_num_seqs) for r in reqs)
    return sum(work[: math.ceil(served_share * len(work))]) / duration_s


def bound_rate(load_at: Callable[[float], float], lo: float, hi: float, rel_tol: float = 0.01) -> float:
    """Highest rate in [lo, hi] whose `load_at(rate)` is at most 1 GPU-second per second, by the
    goodput search (serving.metrics.goodput, without widening the bracket): `hi` if even that fits,
    0.0 if not even `lo` does."""
    return goodput(
        lambda rate: float(load_at(rate) <= 1.0), 1.0, lo=lo, hi=hi, rel_tol=rel_tol, max_expansions=0
    )
