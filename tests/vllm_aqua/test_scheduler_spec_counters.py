"""The Aqua scheduler's counters with speculative decoding: draft tokens are decode work.

Regression: a decode scheduled with its drafts (n > 1 tokens) was counted as prefill, and the
positions of rejected drafts, computed again the next step with other tokens, as recomputed KV
(scheduler.json showed 160 prefill and 64 recomputed tokens for 70 prompt tokens and no preemption).
"""

from __future__ import annotations

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import AQUA_SCHEDULER


def test_draft_tokens_are_neither_prefill_nor_recomputed() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    drafts = 4
    s = bare_scheduler.make_speculative_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER), drafts=drafts, num_blocks=64
    )
    s.add_request(bare_scheduler.make_request("a", 40, 10, arrival_time=0.0))
    s.add_request(bare_scheduler.make_request("b", 30, 10, arrival_time=0.0))
    drafted = 0
    while s.has_requests():
        out = bare_scheduler.step(s)  # the model runner rejects every draft
        drafted += len(out.scheduled_spec_decode_tokens)
        bare_scheduler.propose_drafts(s, drafts)
    assert drafted > 0
    assert s.counters["preemptions"] == 0
    assert s.counters["prefill_tokens"] == 40 + 30
    assert s.counters["recomputed_tokens"] == 0
