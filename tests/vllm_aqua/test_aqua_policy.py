"""The `aqua` fair policy on plain request records (no engine)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from serving.policies.aqua import AquaFairPolicy, service
from serving.policies.base import SchedContext
from serving.policies.registry import get_policy


@dataclass
class Req:
    req_id: str
    num_prompt_tokens: int
    num_computed_prompt_tokens: int = 0
    num_output_tokens: int = 0
    arrival_time: float = 0.0
    admission_seq: int = 0
    num_preemptions: int = 0
    predicted_output_tokens: int | None = None
    slo_class: str | None = None
    max_output_tokens: int | None = None

    @property
    def num_computed_tokens(self) -> int:
        """A decoding request's: its last sampled token's KV is computed by its next step."""
        if self.num_computed_prompt_tokens < self.num_prompt_tokens:
            return self.num_computed_prompt_tokens
        return self.num_prompt_tokens + max(0, self.num_output_tokens - 1)


def ctx(iteration: int = 10, free: int = 0, total: int = 64, max_running: int = 8) -> SchedContext:
    return SchedContext(1.0, iteration, 256, free, total, 16, max_running)


def test_it_is_registered_with_options() -> None:
    p = get_policy("aqua", slice_iters=2)
    assert isinstance(p, AquaFairPolicy) and p.slice_iters == 2
    with pytest.raises(ValueError):
        AquaFairPolicy(slice_iters=0)


def test_service_counts_the_whole_prompt_once_decoding_began() -> None:
    assert service(Req("a", 100, num_computed_prompt_tokens=40)) == 40
    # After a recompute preemption computed prompt is 0, but the prompt was served.
    assert service(Req("b", 100, num_computed_prompt_tokens=0, num_output_tokens=5)) == 105


def test_it_serves_prefills_by_progress_then_decodes_by_generated_tokens() -> None:
    p = AquaFairPolicy()
    reqs = [
        Req("decoding-long", 20, 20, 300, admission_seq=0),
        Req("prefill-half", 200, 100, 0, admission_seq=1),
        Req("decoding-short", 20, 20, 3, admission_seq=2),
        Req("prefill-start", 200, 10, 0, admission_seq=3),
    ]
    order = [r.req_id for r in p.order_running(reqs, ctx())]
    assert order == ["prefill-start", "prefill-half", "decoding-short", "decoding-long"]
    waiting = [Req("old", 50, 0, 40, arrival_time=0.0), Req("new", 50, arrival_time=5.0)]
    assert [r.req_id for r in p.order_waiting(waiting, ctx())] == ["new", "old"]


def test_decode_slots_go_to_the_fewest_generated_tokens_whatever_the_prompt() -> None:
    # Regression: decodes were ordered by service (prompt + generated), so a long prompt with a few
    # tokens generated (service 2010) went after a short prompt with many (service 520), and was
    # the engines' first victim (the last request) when a KV allocation failed.
    p = AquaFairPolicy()
    reqs = [
        Req("long-prompt-few", 2000, 2000, 10, admission_seq=0),
        Req("short-prompt-many", 20, 20, 500, admission_seq=1),
        Req("mid", 300, 300, 100, admission_seq=2),
    ]
    order = [r.req_id for r in p.order_running(reqs, ctx())]
    assert order == ["long-prompt-few", "mid", "short-prompt-many"]


def test_rotation_victims_stay_the_most_served_whatever_the_running_order() -> None:
    # The running order puts "long-prompt-few" first (10 tokens generated), but it is the most
    # served (service 2010): a rotation takes it before "short-prompt-many" (service 520).
    p = AquaFairPolicy(slice_iters=1)
    running = [
        Req("long-prompt-few", 2000, 2000, 10, admission_seq=0),
        Req("short-prompt-many", 20, 20, 500, admission_seq=1),
    ]
    ordered = p.order_running(running, ctx(iteration=0, max_running=2))
    assert [r.req_id for r in ordered] == ["long-prompt-few", "short-prompt-many"]
    victims = p.select_rotations(ordered, [Req("new", 20)], ctx(iteration=3, free=50, max_running=2))
    assert [v.req_id for v in victims] == ["long-prompt-few"]


def test_it_rotates_the_most_served_out_for_a_waiting_request_after_the_time_slice() -> None:
    p = AquaFairPolicy(slice_iters=4, min_service_gap=16)
    running = [Req(f"long-{i}", 32, 32, 200 + i, admission_seq=i) for i in range(4)]
    # First seen running at iteration 0: admitted (and run) at iteration -1.
    ordered = p.order_running(running, ctx(iteration=0))
    waiting = [Req("resumed", 20, 20, 3, arrival_time=9.0)]  # served before (service 23)
    # Inside the time slice (3 iterations run) nobody is rotated.
    assert p.select_rotations(ordered, waiting, ctx(iteration=2, free=0)) == []
    # After it, the most served one (long-3) makes room for the waiting request (2 blocks needed).
    victims = p.select_rotations(ordered, waiting, ctx(iteration=3, free=0))
    assert [v.req_id for v in victims] == ["long-3"]
    # With enough free blocks and a free slot, no rotation is needed.
    assert p.select_rotations(ordered, waiting, ctx(iteration=3, free=8)) == []


def test_a_new_arrival_preempts_after_the_first_slice() -> None:
    p = AquaFairPolicy(slice_iters=4, min_service_gap=16, first_slice_iters=2)
    running = [Req(f"short-{i}", 20, 20, 1, admission_seq=i) for i in range(2)]
    ordered = p.order_running(running, ctx(iteration=5, max_running=2))  # admitted at iteration 4
    new = [Req("new", 20, arrival_time=9.0)]
    assert p.select_rotations(ordered, new, ctx(iteration=5, free=50, max_running=2)) == []
    victims = p.select_rotations(ordered, new, ctx(iteration=6, free=50, max_running=2))
    assert len(victims) == 1
    # A request that was served before (4 prompt tokens: gap 17) waits for the whole slice.
    served = [Req("served", 20, 4, arrival_time=9.0)]
    assert p.select_rotations(ordered, served, ctx(iteration=7, free=50, max_running=2)) == []
    assert len(p.select_rotations(ordered, served, ctx(iteration=8, free=50, max_running=2))) == 1
    with pytest.raises(ValueError):
        AquaFairPolicy(slice_iters=2, first_slice_iters=3)


def test_a_new_arrival_never_takes_the_slot_of_a_request_before_its_first_token() -> None:
    p = AquaFairPolicy(slice_iters=4, min_service_gap=16)
    prefilling = Req("long-prompt", 400, 240, admission_seq=0)  # most served, no token yet
    decoding = Req("decoding", 8, 8, 2, admission_seq=1)  # service 10, below the gap
    ordered = p.order_running([prefilling, decoding], ctx(iteration=0, max_running=2))
    victims = p.select_rotations(ordered, [Req("new", 20)], ctx(iteration=3, free=50, max_running=2))
    assert [v.req_id for v in victims] == ["decoding"]


def test_it_does_not_rotate_for_a_request_that_was_served_as_much() -> None:
    p = AquaFairPolicy(slice_iters=1, min_service_gap=16)
    running = [Req("a", 32, 32, 40, admission_seq=0)]
    ordered = p.order_running(running, ctx(iteration=0))
    waiting = [Req("b", 32, 0, 30, arrival_time=1.0)]  # service 62 vs 72: gap below 16
    assert p.select_rotations(ordered, waiting, ctx(iteration=5, free=0)) == []


def test_it_rotates_for_a_free_slot_when_all_slots_are_taken() -> None:
    p = AquaFairPolicy(slice_iters=1)
    running = [Req(f"r{i}", 16, 16, 100, admission_seq=i) for i in range(2)]
    ordered = p.order_running(running, ctx(iteration=0, max_running=2))
    victims = p.select_rotations(ordered, [Req("w", 8)], ctx(iteration=2, free=50, max_running=2))
    assert len(victims) == 1


def test_a_victim_frees_the_blocks_it_holds_not_one_token_more() -> None:
    # A decoding request holds its sequence but the last sampled token: 16 + 48 tokens, 4 blocks.
    # Counted as 65 tokens (5 blocks) it alone seemed to make room for a 71-token request.
    p = AquaFairPolicy(slice_iters=1)
    running = [Req("r0", 16, 16, 40, admission_seq=0), Req("r1", 16, 16, 49, admission_seq=1)]
    ordered = p.order_running(running, ctx(iteration=0))
    victims = p.select_rotations(ordered, [Req("new", 70)], ctx(iteration=3, free=0))
    assert [v.req_id for v in victims] == ["r1", "r0"]


def test_it_leaves_the_blocks_the_staying_requests_take_this_step() -> None:
    # "stay" holds 32 tokens (2 full blocks): its decode takes a third block before admission.
    p = AquaFairPolicy(slice_iters=1)
    running = [Req("stay", 16, 16, 17, admission_seq=0), Req("victim", 16, 16, 30, admission_seq=1)]
    ordered = p.order_running(running, ctx(iteration=0))
    new = [Req("new", 40)]  # 3 blocks; the victim frees 3 (45 tokens)
    victims = p.select_rotations(ordered, new, ctx(iteration=3, free=1))
    assert [v.req_id for v in victims] == ["victim"]
    victims = p.select_rotations(ordered, new, ctx(iteration=3, free=0))
    assert [v.req_id for v in victims] == ["victim", "stay"]


def test_it_does_not_rotate_when_the_running_prefills_leave_no_token_budget() -> None:
    p = AquaFairPolicy(slice_iters=1)
    prefilling = Req("prefilling", 1000, 100, admission_seq=0)  # 900 tokens left: the whole budget
    running = [prefilling, Req("decoding", 16, 16, 30, admission_seq=1)]
    ordered = p.order_running(running, ctx(iteration=0, max_running=2))
    assert p.select_rotations(ordered, [Req("new", 20)], ctx(iteration=3, free=50, max_running=2)) == []
    prefilling.num_computed_prompt_tokens = 900  # 100 left: the new request would get budget
    victims = p.select_rotations(ordered, [Req("new", 20)], ctx(iteration=3, free=50, max_running=2))
    assert [v.req_id for v in victims] == ["decoding"]


def test_prefill_cap_leaves_one_token_per_decode() -> None:
    assert AquaFairPolicy().prefill_token_cap(ctx(), num_decodes=6) == 250


def test_a_waiting_request_needs_the_blocks_of_its_sequence_not_one_token_more() -> None:
    # vLLM admits a (resumed) request with blocks for its prompt and output tokens: 20 + 12 = 32
    # tokens, 2 blocks, exactly what the victim frees (16 + 16 tokens). Counted as 33 tokens
    # (3 blocks) the rotation seemed not to make room, and the request kept waiting.
    p = AquaFairPolicy(slice_iters=1, min_service_gap=1)
    running = [Req("victim", 16, 16, 17, admission_seq=0)]
    ordered = p.order_running(running, ctx(iteration=0, max_running=1))
    waiting = [Req("resumed", 20, 0, 12, arrival_time=1.0)]
    victims = p.select_rotations(ordered, waiting, ctx(iteration=3, free=0, max_running=1))
    assert [v.req_id for v in victims] == ["victim"]


@dataclass
class SharingReq(Req):
    """A request whose engine knows its shared KV blocks (the optional SchedRequest members)."""

    freed: int | None = None  # blocks its preemption frees
    taken: int | None = None  # blocks its admission takes

    def kv_blocks_freed_by_preemption(self, preempted: Sequence[object]) -> int | None:
        return self.freed

    def kv_blocks_taken_by_admission(self, preempted: Sequence[object]) -> int | None:
        return self.taken


def test_a_victim_sharing_its_prefix_frees_only_what_its_engine_says() -> None:
    # r1 holds 4 blocks (64 tokens) but shares 3 with requests that keep running: it frees 1.
    p = AquaFairPolicy(slice_iters=1)
    r0 = SharingReq("r0", 16, 16, 40, admission_seq=0)
    r1 = SharingReq("r1", 16, 16, 49, admission_seq=1)
    ordered = p.order_running([r0, r1], ctx(iteration=0))
    new = [Req("new", 20)]  # 2 blocks
    assert [v.req_id for v in p.select_rotations(ordered, new, ctx(iteration=3, free=0))] == ["r1"]
    r1.freed = 1
    assert [v.req_id for v in p.select_rotations(ordered, new, ctx(iteration=3, free=0))] == ["r1", "r0"]


def test_a_waiting_request_whose_prefix_is_cached_needs_fewer_blocks() -> None:
    # The victim frees 2 blocks; the new request's 70 tokens take 5, or 2 where 3 hit the prefix cache.
    p = AquaFairPolicy(slice_iters=1)
    ordered = p.order_running([Req("victim", 16, 16, 17, admission_seq=0)], ctx(iteration=0, max_running=1))
    new = SharingReq("new", 70)
    assert p.select_rotations(ordered, [new], ctx(iteration=3, free=0, max_running=1)) == []
    new.taken = 2
    victims = p.select_rotations(ordered, [new], ctx(iteration=3, free=0, max_running=1))
    assert [v.req_id for v in victims] == ["victim"]


def test_a_cached_prefix_held_only_by_the_victim_saves_the_waiting_request_nothing() -> None:
    # The new request's 70 tokens hit 3 cached blocks that only the victim references: preempting
    # the victim frees them, and admission takes them back. Its 2 freed blocks do not make room.
    @dataclass
    class HitsHeldByVictim(Req):
        def kv_blocks_taken_by_admission(self, preempted: Sequence[Req]) -> int | None:
            return 5 if any(r.req_id == "victim" for r in preempted) else 2

    p = AquaFairPolicy(slice_iters=1)
    ordered = p.order_running([Req("victim", 16, 16, 17, admission_seq=0)], ctx(iteration=0, max_running=1))
    new = HitsHeldByVictim("new", 70)
    assert p.select_rotations(ordered, [new], ctx(iteration=3, free=0, max_running=1)) == []


def test_a_served_request_that_waited_max_wait_iters_goes_first_and_needs_no_service_gap() -> None:
    # Least service first starved it: new arrivals always queue ahead of it, and no running
    # request is min_service_gap ahead of it (it has more service than the one running).
    p = AquaFairPolicy(slice_iters=4, min_service_gap=16, max_wait_iters=100)
    ordered = p.order_running([Req("r0", 16, 16, 10, admission_seq=0)], ctx(iteration=0, max_running=1))
    starved = Req("starved", 16, 0, 30, arrival_time=0.0)  # preempted after 30 tokens: service 46
    new = Req("new", 16, arrival_time=5.0)
    assert [r.req_id for r in p.order_waiting([starved, new], ctx(iteration=10))] == ["new", "starved"]
    waiting = p.order_waiting([starved, new], ctx(iteration=109))  # waited 99 iterations
    assert [r.req_id for r in waiting] == ["new", "starved"]
    assert p.select_rotations(ordered, [starved], ctx(iteration=109, free=8, max_running=1)) == []
    waiting = p.order_waiting([starved, new], ctx(iteration=110))  # 100: aged
    assert [r.req_id for r in waiting] == ["starved", "new"]
    victims = p.select_rotations(ordered, waiting, ctx(iteration=110, free=8, max_running=1))
    assert [v.req_id for v in victims] == ["r0"]
    # New arrivals do not age: they are first come first served among themselves anyway.
    late = Req("late", 16, arrival_time=6.0)
    waiting = p.order_waiting([late, new], ctx(iteration=500))
    assert [r.req_id for r in waiting] == ["new", "late"]


def test_an_aged_request_runs_its_full_slice_first_in_the_service_order() -> None:
    p = AquaFairPolicy(slice_iters=4, min_service_gap=16, first_slice_iters=1, max_wait_iters=100)
    p.order_waiting([Req("starved", 16, 0, 30)], ctx(iteration=0))
    p.order_waiting([Req("starved", 16, 0, 30)], ctx(iteration=100))  # aged, and admitted now
    # Next iteration it runs (its recompute done), the most served, with a request admitted with it.
    running = [Req("other", 16, 16, 2, admission_seq=2), Req("starved", 16, 16, 30, admission_seq=1)]
    ordered = p.order_running(running, ctx(iteration=101, max_running=2))
    assert [r.req_id for r in ordered] == ["starved", "other"]  # not the first KV victim
    new = [Req("new", 16, arrival_time=9.0)]
    # A new arrival's wakeup preemption (after first_slice_iters) takes the other one, not it ...
    victims = p.select_rotations(ordered, new, ctx(iteration=102, free=50, max_running=2))
    assert [v.req_id for v in victims] == ["other"]
    # ... until it has run slice_iters iterations; then it is served by service again.
    ordered = p.order_running(running, ctx(iteration=104, max_running=2))
    assert [r.req_id for r in ordered] == ["other", "starved"]
    victims = p.select_rotations(ordered, new, ctx(iteration=104, free=50, max_running=2))
    assert [v.req_id for v in victims] == ["starved"]


@pytest.mark.parametrize("bad", [0, -5, "100", 2.5, True, None])
def test_max_wait_iters_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_wait_iters must be a positive integer, got"):
        get_policy("aqua", max_wait_iters=bad)
