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
