"""Every registered scheduling policy against the interface contract, plus FCFS's own behaviour.

The contract suite is parametrised over `available_policies()`, so a policy registered later is
covered without editing this file.
"""

from __future__ import annotations

import itertools
import random

import pytest

from serving.policies import SchedContext, available_policies, get_policy
from serving.policies.base import id_key
from serving.sim.state import RUNNING, SimRequest
from serving.workload.request import Request
from tests.serving.conftest import make_engine, make_requests

POLICIES = available_policies()


def random_state(seed: int, n: int = 12) -> tuple[list[SimRequest], list[SimRequest], SchedContext]:
    """Requests in assorted states: fresh, mid-prefill, decoding, preempted."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prompt, output = rng.randint(1, 400), rng.randint(1, 300)
        r = SimRequest(
            Request(i, rng.uniform(0, 10), prompt, output), rng.choice([None, rng.randint(1, 500)])
        )
        r.num_output_tokens = rng.randint(0, output - 1)
        r.computed = rng.randint(0, prompt + r.num_output_tokens - 1)
        r.num_preemptions = rng.randint(0, 3)
        reqs.append(r)
    running = reqs[: n // 2]
    for k, r in enumerate(sorted(running, key=lambda r: rng.random())):
        r.admission_seq = k
        r.state = RUNNING
        r.blocks = -(-r.computed // 16)
    waiting = sorted(reqs[n // 2 :], key=lambda r: (r.arrival_time, r.req_id))
    ctx = SchedContext(
        now=11.0 + seed, iteration=seed, token_budget=512, free_kv_blocks=rng.randint(0, 100),
        total_kv_blocks=1000, block_size=16, max_running=8,
    )  # fmt: skip
    return running, waiting, ctx


def same_objects(a: list[SimRequest], b: list[SimRequest]) -> bool:
    return sorted(map(id, a)) == sorted(map(id, b))


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(5))
def test_it_returns_permutations_subsets_and_a_cap_in_range(name: str, seed: int) -> None:
    policy = get_policy(name)
    running, waiting, ctx = random_state(seed)
    w = policy.order_waiting(list(waiting), ctx)
    r = policy.order_running(list(running), ctx)
    assert same_objects(w, waiting) and len(w) == len(waiting)
    assert same_objects(r, running) and len(r) == len(running)
    rot = policy.select_rotations(r, w, ctx)
    assert len({id(x) for x in rot}) == len(rot) and {id(x) for x in rot} <= {id(x) for x in running}
    limit = policy.admission_limit(r, w, ctx)
    assert limit is None or (isinstance(limit, int) and limit >= 0)
    for num_decodes in (0, len(running)):
        cap = policy.prefill_token_cap(ctx, num_decodes)
        assert isinstance(cap, int) and 0 <= cap <= ctx.token_budget
    assert policy.order_waiting([], ctx) == [] and policy.order_running([], ctx) == []


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("mode", ["recompute", "offload_dram"])
def test_it_runs_a_simulation_to_completion(name: str, mode: str) -> None:
    # A small KV cache makes FCFS preempt (checked below), so every engine path is exercised; a
    # policy may avoid preempting. Policies must cope without length predictions (recompute run)
    # and with them (offload run).
    engine = make_engine(name, num_kv_blocks=400, max_num_seqs=32, preemption_mode=mode)
    reqs = make_requests(150, rate=40, seed=7)
    predictions = {r.req_id: r.output_tokens for r in reqs} if mode == "offload_dram" else None
    recs = engine.run(reqs, predictions=predictions)
    if name == "fcfs":
        assert engine.stats.preemptions > 0
    for req, rec in zip(reqs, recs, strict=True):
        assert rec.finished and len(rec.token_times) == req.output_tokens
        assert rec.token_times[0] > req.arrival
        assert all(x < y for x, y in itertools.pairwise(rec.token_times))


def test_fcfs_admits_in_arrival_order_and_serves_in_admission_order() -> None:
    policy = get_policy("fcfs")
    running, waiting, ctx = random_state(0)
    assert [x.admission_seq for x in policy.order_running(running[::-1], ctx)] == sorted(
        x.admission_seq for x in running
    )
    assert policy.order_waiting(waiting[::-1], ctx) == waiting
    assert policy.select_rotations(running, waiting, ctx) == []
    assert policy.admission_limit(running, waiting, ctx) is None
    assert policy.prefill_token_cap(ctx, 3) == ctx.token_budget


def test_fcfs_preempts_the_last_admitted_like_vllm() -> None:
    # Three requests admitted in arrival order; the cache runs out while all decode.
    engine = make_engine("fcfs", block_size=4, num_kv_blocks=9)
    recs = engine.run([Request(i, 0.001 * i, 8, 12) for i in range(3)])
    # The first admitted is never the victim while later ones run; the last admitted goes first.
    assert recs[0].preemptions == 0 and recs[2].preemptions >= 1
    assert recs[2].token_times[4] > recs[1].token_times[4]  # the victim fell behind
    assert all(r.finished for r in recs)


def test_fcfs_puts_a_preempted_request_back_ahead_of_later_arrivals() -> None:
    # B is preempted; C arrives after that, while A runs. C alone would fit in the 2 free blocks,
    # but B is ahead of it (earlier arrival) and needs 4, so C waits behind B until A finishes.
    engine = make_engine("fcfs", block_size=4, num_kv_blocks=6, max_num_seqs=4)
    a, b, c = engine.run([Request(0, 0.0, 8, 8), Request(1, 0.0, 8, 8), Request(2, 0.05, 8, 4)])
    assert b.preemptions == 1 and b.token_times[4] < c.arrival < a.token_times[-1]
    assert c.token_times[0] > a.token_times[-1]
    assert c.token_times[0] >= b.token_times[5]


@pytest.mark.parametrize("name", POLICIES)
def test_requests_arriving_together_are_served_in_id_order(name: str) -> None:
    # Twelve identical requests at t=0, one at a time: every policy served 0, 1, 10, 11, 2, ... (ids
    # compared as text), so request 2 waited behind requests 10 and 11 that came with it.
    engine = make_engine(name, max_num_seqs=1)
    recs = engine.run([Request(i, 0.0, 100, 5) for i in range(12)])
    assert [r.req_id for r in sorted(recs, key=lambda r: r.token_times[0])] == list(range(12))


def test_non_integer_ids_are_ordered_by_their_text() -> None:
    # vLLM's request ids are strings; they keep the text order (and never compare with an int).
    assert sorted(["b", "a10", "a2"], key=id_key) == ["a10", "a2", "b"]
    assert sorted([10, "x", 2], key=id_key) == [2, 10, "x"]


@pytest.mark.parametrize("name", POLICIES)
def test_a_decode_invariant_claim_holds(name: str) -> None:
    # A policy with `decode_invariant = True` lets the engine skip consulting it over decode-only
    # stretches; that must not change any result.
    if not getattr(get_policy(name), "decode_invariant", False):
        pytest.skip(f"{name} does not claim decode invariance")
    reqs = make_requests(200, rate=30, seed=8)
    fast = make_engine(name, num_kv_blocks=500)
    slow = make_engine(name, num_kv_blocks=500, fast_forward=False)
    assert [r.token_times for r in fast.run(reqs)] == [r.token_times for r in slow.run(reqs)]
    assert fast.stats.fast_forwarded_iterations > 0


def test_numpy_integer_ids_are_ordered_by_value() -> None:
    # Ids taken from a numpy array are np.int64, no int subclass: they were ordered as text (10
    # before 2), the tie-break fixed for Python ints.
    import numpy as np

    assert sorted([np.int64(10), np.int64(2), 3], key=id_key) == [2, 3, 10]
    engine = make_engine("fcfs", max_num_seqs=1)
    recs = engine.run([Request(i, 0.0, 100, 5) for i in np.arange(12)])  # type: ignore[arg-type]
    assert [int(r.req_id) for r in sorted(recs, key=lambda r: r.token_times[0])] == list(range(12))
