"""The Aqua scheduler rotates requests out only for waiting requests vLLM admits in that step,
and for the running slots vLLM admits into.

Regression: a new request whose structured-output grammar was still compiling (vLLM skips it)
had the policy rotate a running request out every step for it; vLLM then re-admitted the victim
in the same step in its place (recomputing its whole sequence, or a KV copy out and back), step
after step until the grammar was ready. Under a pause that admits no new requests the victim was
not even re-admitted: it stayed preempted until the engine was unpaused.
"""

from __future__ import annotations

from typing import Any

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import AQUA_SCHEDULER


def _busy_scheduler() -> tuple[Any, Any]:
    """A scheduler with one running slot, held by request "a" (decoding)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    s = bare_scheduler.make_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER), max_num_seqs=1, num_blocks=24, max_num_batched_tokens=128
    )
    a = bare_scheduler.make_request("a", 40, 50, arrival_time=0.0)
    s.add_request(a)
    for _ in range(3):
        bare_scheduler.step(s)
    assert a.num_output_tokens > 0
    return s, a


def test_no_rotation_for_a_request_whose_grammar_is_still_compiling() -> None:
    from vllm.v1.request import RequestStatus

    s, a = _busy_scheduler()
    b = bare_scheduler.make_request("b", 20, 5, arrival_time=1.0)
    b.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR  # no grammar yet
    s.add_request(b)
    for _ in range(4):
        out = bare_scheduler.step(s)
        assert out.preempted_req_ids == set() and out.num_scheduled_tokens == {"a": 1}
    assert a.num_preemptions == 0 and s.counters["rotations"] == 0
    b.status = RequestStatus.WAITING  # the grammar is ready: "b" gets the slot (wakeup preemption)
    out = bare_scheduler.step(s)
    assert out.preempted_req_ids == {"a"} and "b" in out.num_scheduled_tokens
    assert "a" not in out.num_scheduled_tokens  # not re-admitted in the step that rotated it


def test_no_rotation_while_the_engine_admits_no_new_request() -> None:
    from vllm.v1.core.sched.interface import PauseState

    s, a = _busy_scheduler()
    s.set_pause_state(PauseState.PAUSED_NEW)
    s.add_request(bare_scheduler.make_request("b", 20, 5, arrival_time=1.0))
    for _ in range(3):
        out = bare_scheduler.step(s)
        assert out.num_scheduled_tokens == {"a": 1}  # "a" keeps running; "b" waits for the unpause
    assert a.num_preemptions == 0 and s.counters["rotations"] == 0


def test_the_running_slots_are_vllms_active_limit() -> None:
    # Regression: the policy's running slots were max_num_seqs, while vLLM admits up to
    # max_num_active_seqs: with that limit reached the policy saw free slots, planned no rotation,
    # and a new arrival waited for the running request to finish (no time slicing at all).
    from vllm.utils.import_utils import resolve_obj_by_qualname

    s = bare_scheduler.make_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER),
        max_num_seqs=4,
        max_num_active_seqs=1,
        num_blocks=24,
        max_num_batched_tokens=128,
    )
    a = bare_scheduler.make_request("a", 40, 50, arrival_time=0.0)
    s.add_request(a)
    for _ in range(3):
        bare_scheduler.step(s)
    s.add_request(bare_scheduler.make_request("b", 20, 5, arrival_time=1.0))
    out = bare_scheduler.step(s)
    assert out.preempted_req_ids == {"a"} and "b" in out.num_scheduled_tokens
