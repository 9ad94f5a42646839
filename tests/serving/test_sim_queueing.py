"""The engine against closed-form queueing results.

Set-up: every iteration costs exactly D whatever its batch, every request has 1 prompt token and 1
output token (so it is served by exactly one iteration: its prefill emits its only token), and
max_num_seqs=1 makes the engine a single server. Arrivals are Poisson at rate R, so this is an
M/D/1 queue in FCFS order. The quantity compared is the mean TTFT, which here equals the mean
sojourn time (queueing delay plus service): W = D + R * D^2 / (2 * (1 - R * D)) (Pollaczek-
Khinchine with zero service-time variance).
"""

from __future__ import annotations

import itertools
import statistics

import pytest

from serving.sim.engine import EngineSim
from tests.serving.conftest import constant_cost, make_engine, make_requests

D = 0.02


def md1_sojourn(rate: float, service: float) -> float:
    rho = rate * service
    return service + rate * service**2 / (2 * (1 - rho))


@pytest.mark.parametrize(("rho", "n"), [(0.3, 20_000), (0.6, 40_000), (0.8, 120_000)])
def test_it_matches_md1_mean_ttft(rho: float, n: int) -> None:
    rate = rho / D
    engine: EngineSim = make_engine(cost=constant_cost(D), max_num_seqs=1)
    recs = engine.run(make_requests(n, rate=rate, prompt=(1, 1), output=(1, 1), seed=11))
    assert all(r.finished for r in recs)
    mean_ttft = statistics.fmean(r.ttft for r in recs if r.ttft is not None)
    assert mean_ttft == pytest.approx(md1_sojourn(rate, D), rel=0.05)


def test_it_serves_one_at_a_time_with_max_num_seqs_1() -> None:
    engine = make_engine(cost=constant_cost(D), max_num_seqs=1)
    recs = engine.run(make_requests(2000, rate=40, prompt=(1, 1), output=(1, 1), seed=2))
    ends = sorted(r.token_times[0] for r in recs)
    # A single server finishes one request per D at most.
    assert min(b - a for a, b in itertools.pairwise(ends)) >= D * (1 - 1e-9)
