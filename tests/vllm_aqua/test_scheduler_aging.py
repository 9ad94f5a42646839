"""The aqua policy's bounded wait (aging) in the vLLM scheduler plug-in (no model, no engine)."""

from __future__ import annotations

import random
from typing import Any

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import AQUA_SCHEDULER


def _scheduler(max_num_seqs: int, num_blocks: int, max_wait_iters: int, **kwargs: Any) -> Any:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    return bare_scheduler.make_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER),
        max_num_seqs=max_num_seqs,
        num_blocks=num_blocks,
        max_num_batched_tokens=128,
        additional={"aqua_max_wait_iters": max_wait_iters},
        **kwargs,
    )


def test_an_aged_request_with_a_long_recompute_finishes_under_sustained_overload() -> None:
    # Three one-token requests arrive every step and two run at a time, so the long request is
    # rotated out by their wakeup preemption, and its 600-token prompt takes 5 steps of the budget
    # to prefill again after each recompute preemption. Its aged slice used to count from its
    # admission, so it was rotated out again before a new token: 4 of 30 tokens in 600 steps.
    s = _scheduler(max_num_seqs=2, num_blocks=64, max_wait_iters=30, max_model_len=1024)
    s.add_request(bare_scheduler.make_request("long", 600, 30, arrival_time=0.0))
    produced: dict[str, int] = {}
    n = 0
    for step in range(600):
        if step >= 8:
            for _ in range(3):
                s.add_request(bare_scheduler.make_request(f"n{n}", 16, 1, arrival_time=float(step)))
                n += 1
        bare_scheduler.step(s, produced)
        if produced.get("long", 0) == 30:
            break
    assert s.counters["rotations"] > 3  # it was rotated out, and waited for its age, repeatedly
    assert produced.get("long", 0) == 30, (step, produced.get("long"), s.counters)


def test_the_policy_state_stays_bounded_as_requests_come_and_go() -> None:
    # Requests leave without being admitted again (aborted or stopped while waiting, aged or not)
    # or while running; what the policy keeps per request must go with them.
    from vllm.v1.request import RequestStatus

    max_num_seqs = 4
    s = _scheduler(max_num_seqs=max_num_seqs, num_blocks=24, max_wait_iters=10)
    policy = s.aqua_policy
    rng = random.Random(0)
    n = peak_waiting = protected = left_waiting_served = 0
    for step in range(1500):
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            prompt, output = rng.randint(8, 150), rng.randint(2, 100)
            s.add_request(bare_scheduler.make_request(f"r{n}", prompt, output, arrival_time=float(step)))
            n += 1
        served = [r for r in s.waiting if r.num_output_tokens > 0]
        if served and rng.random() < 0.3:
            status = rng.choice([RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_STOPPED])
            s.finish_requests(rng.choice(served).request_id, status)
            left_waiting_served += 1
        while len(s.waiting) > 12:  # keep the queue short: the test is about what outlives a request
            s.finish_requests(s.waiting.peek_request().request_id, RequestStatus.FINISHED_ABORTED)
        if s.running and rng.random() < 0.05:
            s.finish_requests(rng.choice(s.running).request_id, RequestStatus.FINISHED_ABORTED)
        if s.has_requests():
            bare_scheduler.step(s)
        peak_waiting = max(peak_waiting, len(s.waiting))
        protected += bool(policy._protected)
        # At most one entry per request waiting at the last step, or admitted in it.
        assert len(policy._waiting_since) <= len(s.waiting) + max_num_seqs
        assert len(policy._aged) <= len(policy._waiting_since) + max_num_seqs
        assert len(policy._admitted_at) <= max_num_seqs and len(policy._protected) <= max_num_seqs
    assert n > 1000 and left_waiting_served > 100 and protected > 50  # aged requests came and went
    assert peak_waiting <= 12 + 2 * max_num_seqs  # (queued again: rotations and preemptions)
