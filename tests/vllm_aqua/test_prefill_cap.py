"""A policy's prefill_token_cap on vLLM 0.32's real scheduler (no model): the step's prefill tokens
total the cap when there is that much prompt to prefill, and never more; every decode keeps its
tokens (speculative ones included), whichever order the policy serves them in; without a cap the
schedule is vLLM's own."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from serving.policies.base import R, SchedContext
from serving.policies.fcfs import FCFSPolicy
from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.bare_scheduler import make_request, step

BUDGET = 256  # max_num_batched_tokens
DECODERS = ["d0", "d1", "d2", "d3"]


class CappedFCFS(FCFSPolicy):
    """FCFS with a fixed prefill cap (None: the whole budget); optionally serving prefill chunks
    before decodes (the order Aqua's least-service-first gives a prompt that is still prefilling)."""

    def __init__(self, cap: int | None = None, prefills_first: bool = False) -> None:
        self.cap = cap
        self.prefills_first = prefills_first
        self.decodes_seen: list[int] = []

    def order_running(self, running: Sequence[R], ctx: SchedContext) -> list[R]:
        order = super().order_running(running, ctx)
        if self.prefills_first:
            order.sort(key=lambda r: r.num_output_tokens > 0)  # stable: FCFS within each kind
        return order

    def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
        self.decodes_seen.append(num_decodes)
        return ctx.token_budget if self.cap is None else self.cap


def capped_scheduler(policy: CappedFCFS) -> Any:
    from serving.vllm_ext.scheduler import AquaScheduler

    s = bare_scheduler.make_scheduler(
        AquaScheduler, max_num_seqs=16, num_blocks=128, additional={"aqua_policy": "fcfs"}
    )
    s.aqua_policy = policy
    return s


def start_decoders(s: Any, extra: dict[str, int] | None = None) -> None:
    """Four short requests (plus `extra`: id -> prompt tokens, admitted after them) prefill in one
    uncapped step; the four decode from then on."""
    for name in DECODERS:
        s.add_request(make_request(name, 8, 50, 0.0))
    for name, prompt in (extra or {}).items():
        s.add_request(make_request(name, prompt, 50, 0.0))
    out = step(s)
    assert set(out.num_scheduled_tokens) == set(DECODERS) | set(extra or {})


def prefill_tokens(out: Any) -> int:
    return sum(n for r, n in out.num_scheduled_tokens.items() if r not in DECODERS)


def add_prompts(s: Any, prompts: dict[str, int]) -> None:
    for name, n in prompts.items():
        s.add_request(make_request(name, n, 50, 1.0))


@pytest.mark.parametrize("cap", [0, 2, 100])
def test_the_waiting_prompts_prefill_exactly_the_cap_and_every_decode_runs(cap: int) -> None:
    # The old mapping set a per-request limit of cap // 4 (at least 1): 4 tokens for a cap of 0 or 2,
    # and 10 + 10 + 10 + 25 = 55 of a cap of 100.
    policy = CappedFCFS()
    s = capped_scheduler(policy)
    start_decoders(s)
    policy.cap = cap
    add_prompts(s, {"p0": 10, "p1": 10, "p2": 10, "p3": 200})
    out = step(s)
    assert policy.decodes_seen[-1] == 4
    assert prefill_tokens(out) == cap
    assert all(out.num_scheduled_tokens.get(d) == 1 for d in DECODERS)
    assert s.max_num_scheduled_tokens == BUDGET  # restored after the step


def test_a_prefill_chunk_served_before_the_decodes_takes_only_the_cap() -> None:
    # Service order [long, d0..d3]: a step budget of decodes + cap alone would let the chunk take
    # the decodes' tokens too (54 of 54); the old per-request limit (50 // 3) underused the cap.
    policy = CappedFCFS(prefills_first=True)
    s = capped_scheduler(policy)
    start_decoders(s, extra={"long": 400})  # 32 + 224: "long" keeps 176 tokens to prefill
    policy.cap = 50
    add_prompts(s, {"p0": 5, "p1": 5})
    out = step(s)
    assert policy.decodes_seen[-1] == 4
    assert out.num_scheduled_tokens["long"] == 50
    assert prefill_tokens(out) == 50
    assert all(out.num_scheduled_tokens.get(d) == 1 for d in DECODERS)
    # Served after the decodes, the chunk is bounded by the step's budget (decodes + cap) alone.
    policy.prefills_first = False
    out = step(s)
    assert prefill_tokens(out) == 50
    assert out.num_scheduled_tokens["long"] == 50
    assert all(out.num_scheduled_tokens.get(d) == 1 for d in DECODERS)


def test_speculative_decodes_count_as_decodes_with_all_their_tokens() -> None:
    # The old mapping counted a decode with draft tokens (3 tokens without KV) as a prefill: the
    # policy saw no decodes, and the cap of 100 was split eight ways (12 per request).
    from vllm.v1.outputs import DraftTokenIds

    policy = CappedFCFS()
    s = capped_scheduler(policy)
    start_decoders(s)
    step(s)  # a plain decode step
    s.update_draft_token_ids(DraftTokenIds(list(DECODERS), [[5, 5]] * len(DECODERS)))
    policy.cap = 100
    add_prompts(s, {"p0": 10, "p1": 10, "p2": 10, "p3": 200})
    out = step(s)
    assert policy.decodes_seen[-1] == 4
    assert all(out.num_scheduled_tokens.get(d) == 3 for d in DECODERS)
    assert all(len(out.scheduled_spec_decode_tokens[d]) == 2 for d in DECODERS)
    assert prefill_tokens(out) == 100


def run(s: Any, seed: int) -> list[dict[str, int]]:
    """A random workload with arrivals over time; the scheduled tokens of every step."""
    rng = random.Random(seed)
    pending = sorted((rng.randint(0, 30), rng.randint(8, 300), rng.randint(2, 60)) for _ in range(24))
    steps: list[dict[str, int]] = []
    t = 0
    while pending or s.has_requests():
        while pending and pending[0][0] <= t:
            _, prompt, output = pending.pop(0)
            rid = f"{seed}-{24 - len(pending):02d}"  # ids sort in arrival order, as fcfs orders ties
            s.add_request(make_request(rid, prompt, output, arrival_time=float(t)))
        steps.append(dict(step(s).num_scheduled_tokens))
        t += 1
    return steps


@pytest.mark.parametrize("over", [0, 1])
def test_without_a_cap_the_schedule_is_vllms_own(over: int) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    class WholeBudget(FCFSPolicy):
        def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
            return ctx.token_budget + over

    def make(cls: type) -> Any:
        # 24 blocks of 32 tokens hold about 5 of these requests: vLLM preempts too.
        return bare_scheduler.make_scheduler(
            cls, max_num_seqs=8, num_blocks=24, additional={"aqua_policy": "fcfs"}
        )

    from serving.vllm_ext.scheduler import AquaScheduler

    aqua = make(AquaScheduler)
    aqua.aqua_policy = WholeBudget()
    vllm = make(Scheduler)
    for seed in range(2):
        expected = run(vllm, seed)
        assert run(aqua, seed) == expected
    assert aqua.counters["preemptions"] > 0


def test_a_step_that_fails_leaves_the_configured_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    policy = CappedFCFS()
    s = capped_scheduler(policy)
    start_decoders(s)
    policy.cap = 10
    add_prompts(s, {"p0": 100})

    def fail(self: Any, throttle_prefills: bool = False) -> Any:
        assert self.max_num_scheduled_tokens == 4 + 10  # the capped step was under way
        raise RuntimeError("step failed")

    monkeypatch.setattr(Scheduler, "schedule", fail)
    with pytest.raises(RuntimeError, match="step failed"):
        s.schedule()
    assert s.max_num_scheduled_tokens == BUDGET
