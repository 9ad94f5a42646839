"""Which request vLLM preempts under the Aqua scheduler when a KV block allocation fails."""

from __future__ import annotations

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import AQUA_SCHEDULER


def test_under_kv_shortage_vllm_preempts_the_decode_with_the_most_generated_tokens() -> None:
    # Regression: order_running sorted decodes by service (prompt + generated), so a long prompt
    # with a few tokens generated came last, after a short prompt with many, and vLLM (which
    # preempts the last running request when an allocation fails) took the long prompt's KV.
    from vllm.utils.import_utils import resolve_obj_by_qualname

    # 12 usable blocks of 32 tokens (vLLM keeps one null block): "chatty" (prompt 20) generates
    # 100 tokens alone (4 blocks), then "long-prompt" (200 tokens, 7 blocks) joins; decoding both,
    # "chatty" takes the last free block at its 129th token and "long-prompt" finds none at 225.
    s = bare_scheduler.make_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER), max_num_seqs=4, num_blocks=13, max_model_len=512
    )
    chatty = bare_scheduler.make_request("chatty", 20, 400, arrival_time=0.0)
    s.add_request(chatty)
    while chatty.num_output_tokens < 100:
        bare_scheduler.step(s)
    long_prompt = bare_scheduler.make_request("long-prompt", 200, 400, arrival_time=1.0)
    s.add_request(long_prompt)
    for _ in range(100):
        bare_scheduler.step(s)
        if s.counters["preemptions"]:
            break
    assert s.counters["preemptions"] == 1 and s.counters["rotations"] == 0
    assert long_prompt.num_output_tokens < chatty.num_output_tokens  # and service the other way round
    assert long_prompt.num_prompt_tokens + long_prompt.num_output_tokens > chatty.num_tokens
    assert (chatty.num_preemptions, long_prompt.num_preemptions) == (1, 0)
