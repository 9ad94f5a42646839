"""DistServe's colocated baseline: serving/sim's V0 engine with vLLM v0.2's padding, on TP/PP lanes.

The scheduler's own behaviours (prompt runs stall decodes, padding, max_paddings, preemption) are
stated once, in test_sim_v0.py; these tests state what the baseline adds to it.
"""

from __future__ import annotations

import pytest

from serving.distserve import Parallelism, lane_model, run_colocated_vllm_v0
from serving.workload.request import Request

MODEL, GPU = "llama-2-13b", "a100"


@pytest.mark.parametrize("par", [Parallelism(1, 1), Parallelism(2, 1)])
def test_it_pads_prompt_batches_on_the_lane_cost_model(par: Parallelism) -> None:
    cost = lane_model(MODEL, GPU, par).cost
    reqs = [Request(0, 0.0, 300, 2), Request(1, 0.0, 512, 2)]  # 212 padding tokens: within 256
    short, long_ = run_colocated_vllm_v0(reqs, MODEL, GPU, par, 1)
    assert short.token_times[0] == long_.token_times[0] == pytest.approx(cost.prefill_time([512, 512]))


def test_it_batches_prompts_up_to_vllm_v0_2s_padded_budget() -> None:
    recs = run_colocated_vllm_v0(
        [Request(i, 0.0, 512, 2) for i in range(10)], MODEL, GPU, Parallelism(1, 1), 1
    )
    firsts = sorted({r.token_times[0] for r in recs})
    assert [sum(r.token_times[0] == t for r in recs) for t in firsts] == [8, 2]  # 8 x 512 = 4096


def test_it_rejects_a_sequence_longer_than_the_token_budget() -> None:
    reqs = [Request(0, 0.0, 512, 8), Request(1, 0.0, 1000, 100)]
    fits, too_long = run_colocated_vllm_v0(
        reqs, MODEL, GPU, Parallelism(1, 1), 1, max_num_batched_tokens=1024
    )
    assert fits.finished and not too_long.token_times


def test_instances_share_the_load_round_robin() -> None:
    reqs = [Request(i, 0.01 * i, 512, 16) for i in range(40)]
    one = run_colocated_vllm_v0(reqs, MODEL, GPU, Parallelism(1, 1), 1)
    two = run_colocated_vllm_v0(reqs, MODEL, GPU, Parallelism(1, 1), 2)
    assert [r.req_id for r in two] == list(range(40))
    assert max(r.token_times[-1] for r in two) < max(r.token_times[-1] for r in one)
