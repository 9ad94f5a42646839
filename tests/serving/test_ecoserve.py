"""EcoServe policy: queue orders, KV reservation with pipelining, time-synced prefill cap."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import MonkeyPatch

from serving.policies import SchedContext, get_policy
from serving.policies.base import R
from serving.policies.ecoserve import EcoServePolicy, _peak_tokens
from serving.sim.state import RUNNING, SimRequest
from serving.workload.request import Request
from tests.serving.conftest import make_cost, make_engine, make_requests


def ctx(now: float = 10.0, total_blocks: int = 1000, block_size: int = 16) -> SchedContext:
    return SchedContext(now, 0, 2048, total_blocks, total_blocks, block_size, 256)


def req(i: int, arrival: float, prompt: int, output: int, pred: int | None, out: int = 0) -> SimRequest:
    r = SimRequest(Request(i, arrival, prompt, output), pred)
    r.num_output_tokens = out
    r.computed = prompt + out - 1 if out else 0
    if out:
        r.state = RUNNING
        r.admission_seq = i
    return r


def test_it_orders_preempted_gts_then_short_predictions_then_hopeless_requests() -> None:
    policy = EcoServePolicy(ttft_slo_s=1.0, tpot_slo_s=0.1)
    late = req(0, 8.0, 50, 100, 20)  # arrived 2 s ago: its 1 s TTFT is lost
    long = req(1, 9.8, 50, 900, 700)
    short = req(2, 9.9, 50, 40, 30)
    preempted = req(3, 9.0, 50, 200, 150, out=12)
    preempted.computed = 0
    order = policy.order_waiting([late, long, short, preempted], ctx())
    assert [r.req_id for r in order] == [3, 2, 1, 0]


def test_it_serves_gts_before_prompts_and_preempts_the_cheapest_gt_first() -> None:
    policy = EcoServePolicy()
    small_gt = req(0, 0.0, 20, 100, 50, out=5)
    big_gt = req(1, 0.0, 400, 100, 50, out=5)
    pt = req(2, 9.9, 100, 100, 50)
    pt.state = RUNNING
    order = policy.order_running([pt, small_gt, big_gt], ctx())
    assert [r.req_id for r in order] == [1, 0, 2]


def test_pipelining_lets_a_short_request_use_space_reserved_but_not_yet_filled() -> None:
    # 40 blocks x 16 = 640 tokens. A running request holds 100 tokens and is predicted to need 500
    # more (bucket top 512): its reservation is 612. A newcomer of 50 + 30 (bucket top 64) tokens
    # does not fit beside the full reservation, but finishes long before that space is filled.
    running = [req(0, 0.0, 100, 600, 500, out=1)]
    newcomer = req(1, 9.9, 50, 30, 30)
    c = ctx(total_blocks=40)
    assert EcoServePolicy(pipelining=False).admission_limit(running, [newcomer], c) == 0
    assert EcoServePolicy(pipelining=True).admission_limit(running, [newcomer], c) == 1
    # A newcomer that would outlive the filling of that space is held back even with pipelining.
    long_newcomer = req(2, 9.9, 50, 700, 600)
    assert EcoServePolicy(pipelining=True).admission_limit(running, [long_newcomer], c) == 0


def test_the_reservation_counts_whole_kv_blocks_not_tokens() -> None:
    # 3 blocks x 16 = 48 tokens. A running request will hold 20 tokens (2 blocks: 32) and a
    # newcomer 19 or 20 (2 blocks): 39 tokens fit in 48, but their 4 blocks do not fit in 3. Counted
    # in tokens, the newcomer was admitted and the engine had to preempt one of them.
    edges = (0, 10, 20)  # a 15-token prediction reserves its bucket's top, 20
    running = [req(0, 0.0, 1, 20, 15, out=1)]
    newcomer = req(1, 9.9, 1, 20, 15)
    for pipelining in (True, False):
        policy = EcoServePolicy(bucket_edges=edges, pipelining=pipelining)
        assert policy.admission_limit(running, [newcomer], ctx(total_blocks=3)) == 0
        assert policy.admission_limit(running, [newcomer], ctx(total_blocks=4)) == 1
    assert _peak_tokens([2, 1], [19, 20], True) == 39  # one-token blocks: tokens, as before
    assert _peak_tokens([2, 1], [19, 20], True, 16) == 64


def test_reservation_with_exact_predictions_avoids_the_preemptions_fcfs_suffers() -> None:
    reqs = make_requests(150, rate=40, seed=7)
    exact = {r.req_id: r.output_tokens for r in reqs}
    fcfs = make_engine("fcfs", num_kv_blocks=400, max_num_seqs=32)
    fcfs.run(reqs)
    eco = make_engine(EcoServePolicy(pipelining=False), num_kv_blocks=400, max_num_seqs=32)
    recs = eco.run(reqs, predictions=exact)
    assert fcfs.stats.preemptions > 0 and eco.stats.preemptions == 0
    assert all(r.finished for r in recs)


def test_time_synced_prefill_cap_keeps_the_iteration_within_the_tpot_slo() -> None:
    cost = make_cost()
    gts = [req(i, 0.0, 300, 500, 400, out=10) for i in range(20)]
    contexts = [r.num_tokens for r in gts]
    c = ctx()
    for factor in (1.0, 2.0):
        policy = EcoServePolicy(tpot_slo_s=0.05, cost=cost, sync_factor=factor)
        policy.order_running(gts, c)
        cap = policy.prefill_token_cap(c, len(gts))
        limit = 0.05 * factor
        assert 0 < cap < c.token_budget
        assert cost.iteration_time([cap], contexts) <= limit < cost.iteration_time([cap + 1], contexts)
        assert policy.prefill_token_cap(c, 0) == c.token_budget


def test_a_request_re_prefilling_after_a_preemption_is_prompt_work_not_a_decode() -> None:
    # After a recompute preemption a request keeps its output tokens but computes its prompt and
    # output again before its next token. Taken for a GT by its output alone, its context swelled
    # the decode time that time-synced batching sizes the prefill cap by, and it was ordered among
    # the GTs by the KV it would hold.
    cost = make_cost()
    gts = [req(i, 0.0, 300, 500, 400, out=10) for i in range(20)]
    new_pt = req(98, 9.9, 100, 100, 50)
    c = ctx()
    policy = EcoServePolicy(tpot_slo_s=0.05, cost=cost)
    policy.order_running([*gts, new_pt], c)
    cap = policy.prefill_token_cap(c, len(gts))
    assert 0 < cap < c.token_budget
    for computed in (0, 1200, 2005):  # nothing yet, part of its prompt, its prompt and some output
        refilling = req(99, 0.0, 2000, 500, 400, out=40)
        refilling.computed = computed
        assert not policy.is_gt(refilling)
        order = policy.order_running([refilling, new_pt, *gts], c)
        assert [r.req_id for r in order] == [*range(20), 99, 98]  # GTs, then it, then new prompts
        assert policy.prefill_token_cap(c, len(gts)) == cap
    assert all(policy.is_gt(r) for r in gts)


def test_it_is_registered_and_admits_when_nothing_runs() -> None:
    policy = get_policy("ecoserve")
    assert isinstance(policy, EcoServePolicy)
    assert policy.admission_limit([], [req(0, 0.0, 10, 10, 5)], ctx()) is None


class OneAtATime(EcoServePolicy):
    """Admits at most one waiting request per iteration and records the predictions it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, int | None] = {}

    def admission_limit(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> int | None:
        for r in waiting:
            self.seen[int(r.req_id)] = r.predicted_output_tokens  # type: ignore[call-overload]
        return 1


def test_the_engine_honours_admission_limits_and_passes_predictions() -> None:
    policy = OneAtATime()
    engine = make_engine(policy)
    recs = engine.run([Request(i, 0.0, 16, 4) for i in range(3)], predictions={0: 7, 2: 9})
    firsts = sorted(r.token_times[0] for r in recs)
    assert firsts[0] < firsts[1] < firsts[2]  # one admission per iteration, so distinct first tokens
    assert policy.seen == {0: 7, 1: None, 2: 9}


def test_late_requests_wait_while_the_cache_is_filling_on_time_ones_do_not() -> None:
    # 100 blocks x 16 = 1,600 tokens; the running request holds 900 (56%).
    running = [req(0, 0.0, 800, 400, 300, out=100)]
    on_time = req(1, 9.9, 100, 40, 30)
    late = req(2, 5.0, 100, 40, 30)  # arrived 5 s ago: its 1 s TTFT is lost
    c = ctx(total_blocks=100)
    policy = EcoServePolicy(reserve=False, late_kv_share=0.5)
    waiting = policy.order_waiting([late, on_time], c)
    assert [r.req_id for r in waiting] == [1, 2]
    assert policy.admission_limit(running, waiting, c) == 1
    # Without the gate, or with a cache that is mostly free, the late request runs too.
    assert EcoServePolicy(reserve=False, late_kv_share=1.0).admission_limit(running, waiting, c) == 2
    small = [req(0, 0.0, 100, 400, 300, out=10)]
    assert policy.admission_limit(small, waiting, c) == 2


def test_the_late_gate_counts_whole_kv_blocks_not_tokens() -> None:
    # 20 blocks x 16 = 320 tokens, half of them (10 blocks) for late requests. Three running
    # requests hold 17 tokens each: 51 tokens, but 2 blocks each (6). A late request of 66 tokens
    # (2 of prompt, a 2-token prediction counted as its bucket's top, 64) takes 5 blocks: 11 blocks
    # are past the share. Counted in tokens (51 + 66 <= 160) it got in.
    running = [req(i, 0.0, 16, 40, 30, out=1) for i in range(3)]
    late = req(3, 5.0, 2, 2, 2)  # arrived 5 s ago: its 1 s TTFT is lost
    policy = EcoServePolicy(reserve=False, late_kv_share=0.5)
    assert policy.predicted_output(late) == 64
    c = ctx(total_blocks=20)
    assert policy.admission_limit(running, [late], c) == 0
    assert policy.admission_limit(running[:1], [late], c) == 1  # 2 + 5 blocks of 10


def test_each_request_is_judged_by_its_own_class_slo() -> None:
    cost = make_cost()
    loose = SimRequest(Request(0, 9.5, 50, 40, slo_class="summary"), 30)
    tight = SimRequest(Request(1, 9.9, 50, 40, slo_class="code"), 30)
    policy = EcoServePolicy(ttft_slo_s=1.0, tpot_slo_s=0.1, class_slos={"code": (0.3, 0.05)})
    assert policy.slo_of(tight) == (0.3, 0.05) and policy.slo_of(loose) == (1.0, 0.1)
    # The code request arrived later but has less TTFT slack (0.2 s against 0.5 s): it goes first.
    assert [r.req_id for r in policy.order_waiting([loose, tight], ctx())] == [1, 0]
    assert [r.req_id for r in EcoServePolicy().order_waiting([loose, tight], ctx())] == [0, 1]
    # A GT with a tight TPOT in the batch shrinks the prefill tokens the iteration may carry.
    gts = [req(i, 0.0, 300, 500, 400, out=10) for i in range(10)]
    strict = SimRequest(Request(99, 0.0, 300, 500, slo_class="code"), 400)
    strict.num_output_tokens, strict.computed, strict.state = 10, 309, RUNNING
    with_cost = EcoServePolicy(tpot_slo_s=0.1, cost=cost, class_slos={"code": (0.3, 0.05)})
    plain = req(98, 0.0, 300, 500, 400, out=10)
    with_cost.order_running([*gts, plain], ctx())
    cap_loose = with_cost.prefill_token_cap(ctx(), len(gts) + 1)
    with_cost.order_running([*gts, strict], ctx())
    assert 0 < with_cost.prefill_token_cap(ctx(), len(gts) + 1) < cap_loose


def _kv_room_by_scan(
    policy: EcoServePolicy, running: list[SimRequest], waiting: list[SimRequest], c: SchedContext
) -> int:
    """The reservation's room checked prefix by prefix (what `_kv_room` computes)."""
    cap = policy.kv_target * c.total_kv_blocks * c.block_size
    both = [*running, *waiting]
    held = [r.num_prompt_tokens + r.num_output_tokens for r in both]
    steps = [policy.predicted_output(r) - r.num_output_tokens for r in both]
    for k in range(len(waiting)):
        end = len(running) + k + 1
        if _peak_tokens(held[:end], steps[:end], policy.pipelining, c.block_size) > cap:
            return k
    return len(waiting)


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 600), st.integers(0, 30)), max_size=40),
    n_running=st.integers(0, 10),
    blocks=st.integers(1, 400),
    pipelining=st.booleans(),
)
def test_the_kv_reservation_admits_the_longest_prefix_that_fits(
    lens: list[tuple[int, int, int]], n_running: int, blocks: int, pipelining: bool
) -> None:
    reqs = [req(i, 0.0, p, pred + 1, pred, out=min(out, pred)) for i, (p, pred, out) in enumerate(lens)]
    running = [r for r in reqs[:n_running] if r.num_output_tokens]
    waiting = [r for r in reqs if r not in running]
    policy, c = EcoServePolicy(pipelining=pipelining), ctx(total_blocks=blocks)
    assert policy._kv_room(running, waiting, c) == _kv_room_by_scan(policy, running, waiting, c)


def test_the_kv_reservation_of_a_long_queue_is_not_checked_prefix_by_prefix(monkeypatch: MonkeyPatch) -> None:
    # It computed the peak of every prefix of the waiting queue, each over the whole prefix, at every
    # iteration: cubic in the queue (a 60 s run at 50 req/s of python -m serving.sim --policy
    # ecoserve --predict oracle had not finished after 120 s; 8 s now).
    import serving.policies.ecoserve as eco

    calls: list[int] = []
    real = eco._peak_tokens

    def counted(held: list[int], steps: list[int], pipelining: bool, block_size: int) -> float:
        calls.append(len(held))
        return real(held, steps, pipelining, block_size)

    monkeypatch.setattr(eco, "_peak_tokens", counted)
    waiting = [req(i, 0.0, 10, 20, 10) for i in range(1000)]
    assert EcoServePolicy()._kv_room([], waiting, ctx(total_blocks=10**6)) == 1000
    assert len(calls) <= 11  # log2(1000) + 1


def test_the_last_two_buckets_are_ordered_apart_like_the_others() -> None:
    # The PT queue grouped requests by the bucket of their reservation's top, the next bucket's lower
    # edge: every bucket moved up one, and the last two (512..1023 and 1024+, tops 1024 and 2048)
    # both read as the last, so a 600-token prediction waited behind a 1,500-token one with less
    # slack, while 200 and 300 tokens (two buckets lower) were ordered short first.
    policy = EcoServePolicy()
    for short_pred, long_pred in ((200, 300), (600, 1500)):
        long = req(0, 9.5, 50, long_pred + 1, long_pred)  # less TTFT slack
        short = req(1, 9.9, 50, short_pred + 1, short_pred)
        assert [r.req_id for r in policy.order_waiting([long, short], ctx())] == [1, 0]
    # Within one bucket, least slack first.
    a, b = req(0, 9.5, 50, 1101, 1100), req(1, 9.9, 50, 1501, 1500)
    assert [r.req_id for r in policy.order_waiting([b, a], ctx())] == [0, 1]
