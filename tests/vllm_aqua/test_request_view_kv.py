"""VllmRequestView's `kv_blocks_freed_by_preemption` against what vLLM's preemption really frees."""

from __future__ import annotations

import time

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import BLOCK_SIZE


def test_it_counts_the_blocks_a_preemption_returns_to_the_free_pool_with_prefix_caching() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from serving.vllm_ext.request_view import VllmRequestView

    s = bare_scheduler.make_scheduler(Scheduler, max_num_seqs=4, num_blocks=24, enable_prefix_caching=True)
    hasher = bare_scheduler.prefix_block_hasher()
    system_prompt = list(range(1, 3 * BLOCK_SIZE + 1))  # 3 full blocks
    prompts = {
        "a": system_prompt + [500 + j for j in range(40)],
        "b": system_prompt + [600 + j for j in range(50)],
        "c": [700 + j for j in range(45)],  # shares nothing
    }
    for rid, prompt in prompts.items():
        s.add_request(
            bare_scheduler.make_request(rid, len(prompt), 20, 0.0, prefix=prompt, block_hasher=hasher)
        )
    for _ in range(4):
        bare_scheduler.step(s)
    kv = s.kv_cache_manager
    views = {rid: VllmRequestView(s.requests[rid], 0, kv) for rid in prompts}
    held = {rid: len(kv.get_blocks(rid).blocks[0]) for rid in prompts}
    assert all(s.requests[rid].num_output_tokens > 0 for rid in prompts)

    # a alone frees only its own blocks (b keeps the system prompt's); after a, b frees them all.
    assert views["a"].kv_blocks_freed_by_preemption([]) == held["a"] - 3
    assert views["b"].kv_blocks_freed_by_preemption([views["a"]]) == held["b"]
    assert views["c"].kv_blocks_freed_by_preemption([views["a"], views["b"]]) == held["c"]
    # Without the manager the view cannot tell, and the policy estimates.
    assert VllmRequestView(s.requests["a"], 0).kv_blocks_freed_by_preemption([]) is None

    expected = {
        "a": views["a"].kv_blocks_freed_by_preemption([]),
        "b": views["b"].kv_blocks_freed_by_preemption([views["a"]]),
    }
    for rid in ("a", "b"):  # what vLLM's own preemption returns to the free pool
        free = kv.block_pool.get_num_free_blocks()
        request = s.requests[rid]
        s.running.remove(request)
        s._preempt_request(request, time.monotonic())
        assert kv.block_pool.get_num_free_blocks() - free == expected[rid], rid


def test_it_counts_the_blocks_an_admission_takes_less_the_prefix_hits_others_keep() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from serving.vllm_ext.request_view import VllmRequestView

    s = bare_scheduler.make_scheduler(Scheduler, max_num_seqs=4, num_blocks=24, enable_prefix_caching=True)
    hasher = bare_scheduler.prefix_block_hasher()
    system_prompt = list(range(1, 3 * BLOCK_SIZE + 1))  # 3 full blocks
    a = system_prompt + [500 + j for j in range(40)]
    s.add_request(bare_scheduler.make_request("a", len(a), 20, 0.0, prefix=a, block_hasher=hasher))
    for _ in range(3):
        bare_scheduler.step(s)
    b = system_prompt + [600 + j for j in range(50)]  # 146 tokens: 5 blocks, 3 of them a's
    s.add_request(bare_scheduler.make_request("b", len(b), 20, 1.0, prefix=b, block_hasher=hasher))
    kv = s.kv_cache_manager
    view_a = VllmRequestView(s.requests["a"], 0, kv)
    view_b = VllmRequestView(s.requests["b"], -1, kv)
    assert view_b.kv_blocks_taken_by_admission([]) == 5 - 3
    # Were `a` preempted, its blocks would be free (and cached): admission would take them back.
    assert view_b.kv_blocks_taken_by_admission([view_a]) == 5
    assert VllmRequestView(s.requests["b"], -1).kv_blocks_taken_by_admission([]) is None

    free, held_a = kv.block_pool.get_num_free_blocks(), len(kv.get_blocks("a").blocks[0])
    out = bare_scheduler.step(s)  # admits b (and decodes a)
    assert [r.req_id for r in out.scheduled_new_reqs] == ["b"]
    grown_a = len(kv.get_blocks("a").blocks[0]) - held_a
    assert free - kv.block_pool.get_num_free_blocks() - grown_a == 5 - 3
