"""The engine never idles while a request it accepted is unfinished (every policy and configuration).

A run's iterations, seen through the engine's iteration hook, are contiguous while any accepted
request is in the system; when the system empties, the next iteration starts exactly at the next
arrival it serves. Every first token also comes at least one prefill of the request's prompt
(fixed cost plus per-token cost on the cost model) after its arrival.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings

from serving.sim import EngineSim
from serving.workload.request import Request
from tests.serving.conftest import make_cost, peer_store
from tests.serving.test_sim_invariants import KV_BYTES, POLICIES, Setup, make_policy, setups, workloads


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None)
@given(setup=setups(), workload=workloads())
def test_it_never_idles_while_an_accepted_request_is_unfinished(
    policy: str, setup: Setup, workload: tuple[list[Request], dict[int, int] | None]
) -> None:
    reqs, predictions = workload
    cost = make_cost(kv_bytes_per_token=KV_BYTES)
    engine = EngineSim(cost, setup.config, make_policy(policy, cost), store=peer_store(setup.config))
    spans: list[tuple[float, float]] = []
    engine.on_iteration = lambda start, dt, *_: spans.append((start, start + dt))
    recs = engine.run(reqs, changes=setup.changes, predictions=predictions)
    served = [(q, r) for q, r in zip(reqs, recs, strict=True) if r.token_times]
    p = cost.prefill
    for q, r in served:
        assert r.token_times[0] - q.arrival >= p.a + p.b * q.prompt_tokens - 1e-12
    arrivals = sorted(q.arrival for q, _ in served)
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start == end:
            continue
        busy = [q.req_id for q, r in served if q.arrival <= end < r.token_times[-1]]
        assert not busy, f"idle from {end} to {start} with {busy} unfinished"
        # Idle: the next iteration starts at the next arrival it serves.
        assert start == min(t for t in arrivals if t > end), (end, start)
