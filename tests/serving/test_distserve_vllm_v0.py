"""DistServe's colocated baseline: a vLLM v0.2-style engine (prompt runs first, whole prompts)."""

from __future__ import annotations

import pytest

from serving.costmodel import get_preset
from serving.distserve import Parallelism, VllmV0Config, VllmV0Sim, run_colocated_vllm_v0
from serving.workload.request import Request

MODEL, GPU = "llama-2-13b", "a100"
COST = get_preset(MODEL, GPU)


def make_sim(kv_tokens: int = 60_000, max_num_batched_tokens: int = 4096) -> VllmV0Sim:
    return VllmV0Sim(COST, VllmV0Config(kv_tokens, max_num_batched_tokens))


def test_it_runs_a_waiting_prompt_before_the_running_requests_next_decode() -> None:
    first = COST.prefill_time([512])
    # B arrives while A's first decode step is in flight.
    a, b = make_sim().run([Request(0, 0.0, 512, 4), Request(1, first + 1e-4, 512, 4)])
    decode_a = COST.decode_time([513])
    assert a.token_times[1] == pytest.approx(first + decode_a)
    assert b.token_times[0] == pytest.approx(a.token_times[1] + first)  # B's prompt run, alone
    # A's next token waits for B's whole prompt run, then both decode together.
    gap = a.token_times[2] - a.token_times[1]
    assert gap == pytest.approx(first + COST.decode_time([514, 513]))


def test_it_never_splits_a_prompt() -> None:
    (r,) = make_sim().run([Request(0, 0.5, 3000, 2)])
    assert r.ttft == pytest.approx(COST.prefill_time([3000]))


def test_it_batches_waiting_prompts_up_to_the_padded_token_budget() -> None:
    reqs = [Request(i, 0.0, 512, 2) for i in range(10)]
    recs = make_sim(max_num_batched_tokens=4096).run(reqs)
    firsts = sorted({r.token_times[0] for r in recs})
    assert [sum(r.token_times[0] == t for r in recs) for t in firsts] == [8, 2]
    assert firsts[0] == pytest.approx(COST.prefill_time([512] * 8))


def test_it_preempts_the_last_admitted_request_and_recomputes_it() -> None:
    # Room for about three whole sequences: the fourth, admitted last, is preempted as they grow.
    reqs = [Request(i, 0.0, 500, 200) for i in range(4)]
    sim = make_sim(kv_tokens=2200)
    recs = sim.run(reqs)
    assert all(r.finished and len(r.token_times) == 200 for r in recs)
    assert sim.preemptions > 0
    assert recs[3].preemptions > 0 and recs[0].preemptions == 0
    assert recs[3].recomputed_tokens > 500  # its prompt and the tokens it had generated


def test_instances_share_the_load_round_robin() -> None:
    reqs = [Request(i, 0.01 * i, 512, 16) for i in range(40)]
    one = run_colocated_vllm_v0(reqs, MODEL, GPU, Parallelism(1, 1), 1)
    two = run_colocated_vllm_v0(reqs, MODEL, GPU, Parallelism(1, 1), 2)
    assert [r.req_id for r in two] == list(range(40))
    assert max(r.token_times[-1] for r in two) < max(r.token_times[-1] for r in one)
