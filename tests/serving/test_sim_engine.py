"""Engine mechanics: chunked prefill, continuous batching, limits, KV blocks, fast forward."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest

from serving.policies.base import R, SchedContext
from serving.policies.fcfs import FCFSPolicy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.workload.request import Request
from tests.serving.conftest import make_cost, make_engine, make_requests

Trace = list[tuple[float, float, int, int, float]]


def traced(engine: EngineSim) -> Trace:
    log: Trace = []
    engine.on_iteration = lambda *row: log.append(row)
    return log


def test_it_splits_a_long_prompt_into_budget_sized_chunks() -> None:
    cost = make_cost()
    engine = make_engine(cost=cost, max_num_batched_tokens=2048, fast_forward=False)
    log = traced(engine)
    (rec,) = engine.run([Request(0, 0.0, 5000, 2)])
    assert [row[2] for row in log[:3]] == [2048, 2048, 904]
    # The first token comes at the end of the last chunk, after three prefill iterations.
    expected = sum(cost.prefill_time([n]) for n in (2048, 2048, 904))
    assert rec.token_times[0] == pytest.approx(expected)
    assert rec.token_times[1] == pytest.approx(expected + cost.decode_time([5001]))


def test_it_batches_a_new_prefill_with_running_decodes() -> None:
    cost = make_cost()
    engine = make_engine(cost=cost, fast_forward=False)
    log = traced(engine)
    a, b = engine.run([Request(0, 0.0, 100, 10), Request(1, 0.001, 50, 3)])
    # Iteration 2 starts after the first prefill and mixes A's decode with B's whole prompt.
    start, dt, prefill_tokens, decodes, _ = log[1]
    assert (prefill_tokens, decodes) == (50, 1)
    assert dt == pytest.approx(cost.iteration_time([50], [101]))
    assert a.token_times[1] == b.token_times[0] == pytest.approx(start + dt)


def test_it_never_runs_more_than_max_num_seqs() -> None:
    engine = make_engine(max_num_seqs=2)
    log = traced(engine)
    recs = engine.run([Request(i, 0.0, 20, 30 + 10 * i) for i in range(3)])
    assert max(row[2] // 20 + row[3] for row in log) == 2
    # The third request starts only once the first (shortest) has finished.
    assert recs[2].token_times[0] > recs[0].token_times[-1]


def test_it_emits_every_token_in_order_after_arrival() -> None:
    recs = make_engine(num_kv_blocks=600).run(make_requests(300, rate=30, seed=3))
    for rec in recs:
        assert rec.finished and len(rec.token_times) == rec.output_tokens
        assert rec.token_times[0] > rec.arrival
        assert all(x < y for x, y in itertools.pairwise(rec.token_times))


def test_it_keeps_kv_blocks_within_capacity() -> None:
    engine = make_engine(num_kv_blocks=300, block_size=16)
    seen: list[int] = []
    engine.on_iteration = lambda *row: seen.append(engine.kv.free)
    engine.run(make_requests(200, rate=50, seed=4))
    assert min(seen) >= 0 and engine.stats.preemptions > 0
    assert engine.kv.free == engine.kv.total == 300  # everything returned at the end


def test_it_rejects_a_request_that_could_never_fit() -> None:
    engine = make_engine(num_kv_blocks=4, block_size=16)
    big, ok = engine.run([Request(0, 0.0, 60, 10), Request(1, 0.0, 30, 10)])
    assert big.token_times == [] and engine.stats.rejected == 1
    assert ok.finished


def test_it_stops_at_the_horizon_with_partial_records() -> None:
    recs = make_engine().run([Request(0, 0.0, 10, 1000)], until=1.0)
    assert 0 < len(recs[0].token_times) < 1000 and not recs[0].finished


@pytest.mark.parametrize("mode", ["recompute", "offload_dram", "offload_peer"])
def test_it_fast_forwards_to_exactly_the_stepped_result(mode: str) -> None:
    reqs = make_requests(400, rate=40, seed=5)
    peer = 50 * 16 * 131072 if mode == "offload_peer" else 0
    base = EngineConfig(num_kv_blocks=500, preemption_mode=mode, peer_capacity_bytes=peer)
    fast = make_engine(**dataclasses.asdict(base))
    slow = make_engine(**{**dataclasses.asdict(base), "fast_forward": False})
    a, b = fast.run(reqs), slow.run(reqs)
    assert fast.stats.fast_forwarded_iterations > 0 and slow.stats.fast_forwarded_iterations == 0
    assert fast.stats.preemptions == slow.stats.preemptions > 0
    assert fast.stats.iterations == slow.stats.iterations
    assert [r.token_times for r in a] == [r.token_times for r in b]  # bit-identical floats
    assert [(r.bytes_moved, r.recomputed_tokens) for r in a] == [
        (r.bytes_moved, r.recomputed_tokens) for r in b
    ]


def test_it_fast_forwards_with_a_block_larger_than_any_sequence() -> None:
    # Fast forward kept one counter per token of a block: a block of 10**20 tokens raised
    # OverflowError ("cannot fit 'int' into an index-sized integer").
    reqs = make_requests(40, rate=20, seed=3)
    base = EngineConfig(block_size=10**20, num_kv_blocks=1)
    fast = make_engine(**dataclasses.asdict(base))
    slow = make_engine(**{**dataclasses.asdict(base), "fast_forward": False})
    a, b = fast.run(reqs), slow.run(reqs)
    assert fast.stats.fast_forwarded_iterations > 0
    assert [r.token_times for r in a] == [r.token_times for r in b] and all(r.finished for r in a)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_num_batched_tokens", 0, "max_num_batched_tokens=0"),
        ("max_num_seqs", -1, "max_num_seqs=-1"),
        ("block_size", 0, "block_size=0"),
        ("num_kv_blocks", 0, "num_kv_blocks=0"),
        ("preemption_mode", "swap", "preemption_mode='swap'"),
        ("peer_capacity_bytes", 10, "peer_capacity_bytes=10"),
    ],
)
def test_it_rejects_bad_config_naming_the_value(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


class _Rotating(FCFSPolicy):
    """Time slicing: while anyone waits, preempt running requests that generated >= 10 tokens."""

    decode_invariant = False

    def select_rotations(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        return [r for r in running if r.num_output_tokens >= 10] if waiting else []


class _CappedPrefill(FCFSPolicy):
    def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
        return 64


def test_it_preempts_the_requests_a_policy_rotates() -> None:
    engine = make_engine(_Rotating(), max_num_seqs=1, fast_forward=False)
    long, short = engine.run([Request(0, 0.0, 10, 100), Request(1, 0.05, 10, 5)])
    assert long.preemptions == 1 and engine.stats.rotations == 1
    assert short.token_times[-1] < long.token_times[-1]  # the short one finished during the long one
    assert long.recomputed_tokens > 10


def test_it_limits_prefill_chunks_to_the_policy_cap() -> None:
    engine = make_engine(_CappedPrefill())
    log = traced(engine)
    recs = engine.run([Request(0, 0.0, 300, 5), Request(1, 0.0, 100, 5)])
    assert max(row[2] for row in log) == 64
    assert all(r.finished for r in recs)
    # 400 prompt tokens at 64 per iteration: the second prompt completes in the 7th iteration.
    assert recs[1].token_times[0] == pytest.approx(sum(row[1] for row in log[:7]))


class _RotatesWaiting(FCFSPolicy):
    decode_invariant = False

    def select_rotations(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        return list(waiting)


class _NeverPrefills(FCFSPolicy):
    def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
        return 0


def test_it_refuses_rotations_of_requests_that_are_not_running() -> None:
    engine = make_engine(_RotatesWaiting(), max_num_seqs=1)
    with pytest.raises(ValueError, match="not running"):
        engine.run([Request(0, 0.0, 10, 50), Request(1, 0.001, 10, 5)])


def test_it_reports_a_policy_that_starves_every_request() -> None:
    engine = make_engine(_NeverPrefills())
    with pytest.raises(RuntimeError, match="stalled"):
        engine.run([Request(0, 0.0, 10, 5)])


def test_it_reports_progress_over_simulated_time() -> None:
    seen: list[float] = []
    engine = make_engine()
    engine.run(make_requests(200, rate=20, seed=9), progress=seen.append)
    assert seen == sorted(seen) and len(seen) > 5
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(seen))
    assert seen[-1] > engine.stats.end_time - 5.0


def test_an_idle_engine_stops_at_the_horizon() -> None:
    engine = make_engine()
    engine.run([Request(0, 0.0, 10, 2), Request(1, 50.0, 10, 2)], until=10.0)
    assert engine.stats.end_time == 10.0


class _Recording(FCFSPolicy):
    def __init__(self) -> None:
        self.seen: dict[object, int | None] = {}

    def order_waiting(self, waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        self.seen.update({r.req_id: r.predicted_output_tokens for r in waiting})
        return super().order_waiting(waiting, ctx)


def test_the_policy_sees_length_predictions_when_given() -> None:
    policy = _Recording()
    make_engine(policy).run([Request(0, 0.0, 10, 7), Request(1, 0.0, 10, 9)], predictions={0: 5})
    assert policy.seen == {0: 5, 1: None}


def test_it_continues_across_runs_with_a_horizon() -> None:
    # Run in one-second chunks (as the simulated GPU hosts do): same records as one run.
    reqs = make_requests(100, rate=20, seed=12)
    whole = make_engine().run(reqs)
    engine = make_engine()
    chunked = []
    for t in range(1, 40):
        chunked += engine.run([r for r in reqs if t - 1 <= r.arrival < t], until=float(t))
    chunked += engine.run([])
    assert [r.token_times for r in sorted(chunked, key=lambda r: r.req_id)] == [r.token_times for r in whole]


def test_a_stalled_engine_with_a_horizon_waits_for_it() -> None:
    engine = make_engine(_NeverPrefills())
    (rec,) = engine.run([Request(0, 0.0, 10, 5)], until=3.0)
    assert rec.token_times == [] and engine.now == 3.0
