"""The paper-era vLLM V0 scheduler step: prefill-only iterations, whole prompts, watermark, and
(optionally) prompt batches padded to their longest prompt as in vLLM v0.2."""

from __future__ import annotations

import dataclasses

import pytest

from serving.metrics.records import RequestRecord
from serving.sim.config import EngineConfig
from serving.sim.events import KV_GROW, TimedChange
from serving.workload.request import Request
from tests.serving.conftest import make_cost, make_engine, make_requests


def test_a_new_prompt_stalls_running_decodes_for_its_whole_prefill() -> None:
    cost = make_cost()
    engine = make_engine(cost=cost, scheduler="v0", max_num_batched_tokens=4096, fast_forward=False)
    log: list[tuple[float, float, int, int, float]] = []
    engine.on_iteration = lambda *row: log.append(row)
    a, b = engine.run([Request(0, 0.0, 100, 10), Request(1, 0.001, 3000, 3)])
    # Iteration 2 prefills B's whole prompt alone (V1 would chunk it and decode A beside it).
    assert (log[1][2], log[1][3]) == (3000, 0)
    assert log[1][1] == pytest.approx(cost.prefill_time([3000]))
    # A's second token waits for the end of that prefill.
    assert a.token_times[1] == pytest.approx(log[1][0] + log[1][1] + cost.decode_time([101, 3001]))
    assert b.token_times[0] == pytest.approx(log[1][0] + log[1][1])


def test_v1_on_the_same_requests_chunks_the_prompt_and_keeps_decoding() -> None:
    engine = make_engine(max_num_batched_tokens=2048, fast_forward=False)
    log: list[tuple[float, float, int, int, float]] = []
    engine.on_iteration = lambda *row: log.append(row)
    engine.run([Request(0, 0.0, 100, 10), Request(1, 0.001, 3000, 3)])
    assert (log[1][2], log[1][3]) == (2047, 1)


def test_it_rejects_a_sequence_longer_than_the_budget() -> None:
    engine = make_engine(scheduler="v0", max_num_batched_tokens=512)
    fits, too_long = engine.run([Request(0, 0.0, 400, 100), Request(1, 0.0, 500, 100)])
    assert fits.finished and not too_long.token_times and engine.stats.rejected == 1


def test_it_keeps_a_watermark_of_free_blocks_at_admission() -> None:
    # 200 blocks, watermark 2. A holds 100 blocks and grows; B needs 99, which would leave 1 free:
    # V0 holds B back until A finishes, where V1 admits it at once and then runs short.
    reqs = [Request(0, 0.0, 1600, 20), Request(1, 0.001, 99 * 16, 2)]
    v0 = make_engine(scheduler="v0", num_kv_blocks=200, max_num_batched_tokens=4096)
    a, b = v0.run(reqs)
    assert b.token_times[0] > a.token_times[-1] and v0.stats.preemptions == 0
    v1 = make_engine(num_kv_blocks=200, max_num_batched_tokens=4096)
    a1, b1 = v1.run(reqs)
    assert b1.token_times[0] < a1.token_times[-1]


def test_it_refuses_a_sequence_that_only_fits_below_the_watermark() -> None:
    engine = make_engine(scheduler="v0", num_kv_blocks=200, max_num_batched_tokens=4096)
    (rec,) = engine.run([Request(0, 0.0, 199 * 16, 1)])
    assert not rec.token_times and engine.stats.rejected == 1


def test_the_watermark_follows_a_grown_cache() -> None:
    # 100 blocks (watermark 1) grow to 200 (watermark 2): a 199-block prompt fits below the old
    # watermark only. It was accepted and waited for ever: RuntimeError "engine stalled".
    engine = make_engine(scheduler="v0", num_kv_blocks=100, block_size=1, max_num_batched_tokens=512)
    grow = TimedChange(0.0, KV_GROW, 0, 100)
    too_long, fits = engine.run([Request(0, 0.0, 199, 1), Request(1, 0.0, 198, 1)], changes=[grow])
    assert not too_long.token_times and fits.finished and engine.stats.rejected == 1


def test_it_preempts_by_recompute_and_still_finishes_everything() -> None:
    reqs = make_requests(300, rate=40, seed=3)
    base = EngineConfig(num_kv_blocks=300, scheduler="v0", max_num_batched_tokens=4096)
    fast = make_engine(**dataclasses.asdict(base))
    slow = make_engine(**{**dataclasses.asdict(base), "fast_forward": False})
    a, b = fast.run(reqs), slow.run(reqs)
    assert fast.stats.preemptions == slow.stats.preemptions > 0
    assert all(r.finished for r in a)
    assert sum(r.recomputed_tokens for r in a) > 0
    assert [r.token_times for r in a] == [r.token_times for r in b]


def test_it_preempts_the_last_admitted_request_and_recomputes_it() -> None:
    # Room for about three whole sequences: the fourth, admitted last, is preempted as they grow.
    engine = make_engine(scheduler="v0", num_kv_blocks=2200 // 16, max_num_batched_tokens=4096)
    recs = engine.run([Request(i, 0.0, 500, 200) for i in range(4)])
    assert all(r.finished for r in recs) and engine.stats.preemptions > 0
    assert recs[3].preemptions > 0 and recs[0].preemptions == 0
    assert recs[3].recomputed_tokens > 500  # its prompt and the tokens it had generated


def first_batch(recs: list[RequestRecord]) -> list[int]:
    """Ids of the requests whose first token came with the earliest one."""
    t = min(r.token_times[0] for r in recs)
    return [r.req_id for r in recs if r.token_times[0] == t]


def test_a_padded_prompt_batch_costs_its_longest_prompt_times_its_size() -> None:
    cost = make_cost()
    reqs = [Request(0, 0.0, 100, 2), Request(1, 0.0, 300, 2)]
    padded = make_engine(cost=cost, scheduler="v0", max_num_batched_tokens=4096, v0_pad_prompts=True)
    plain = make_engine(cost=cost, scheduler="v0", max_num_batched_tokens=4096)
    p, q = padded.run(reqs), plain.run(reqs)
    assert first_batch(p) == first_batch(q) == [0, 1]
    assert p[0].token_times[0] == pytest.approx(cost.prefill_time([300, 300]))
    assert q[0].token_times[0] == pytest.approx(cost.prefill_time([100, 300]))


def test_a_padded_prompt_batch_must_fit_the_budget_padded() -> None:
    # Padded: 3 x 300 = 900 fits 1000, 4 x 300 does not; unpadded the four prompts sum to 1000.
    reqs = [
        Request(0, 0.0, 300, 2),
        Request(1, 0.0, 100, 2),
        Request(2, 0.0, 300, 2),
        Request(3, 0.0, 300, 2),
    ]
    padded = make_engine(scheduler="v0", max_num_batched_tokens=1000, v0_pad_prompts=True)
    plain = make_engine(scheduler="v0", max_num_batched_tokens=1000)
    assert first_batch(padded.run(reqs)) == [0, 1, 2]
    assert first_batch(plain.run(reqs)) == [0, 1, 2, 3]


def test_max_paddings_limits_a_prompt_batch() -> None:
    # Padding to 500: one 100-token prompt adds 400 padding tokens, a second one 800 in all.
    reqs = [Request(0, 0.0, 500, 2), Request(1, 0.0, 100, 2), Request(2, 0.0, 100, 2)]
    limited = make_engine(
        scheduler="v0", max_num_batched_tokens=4096, v0_pad_prompts=True, v0_max_paddings=500
    )
    unlimited = make_engine(scheduler="v0", max_num_batched_tokens=4096, v0_pad_prompts=True)
    assert first_batch(limited.run(reqs)) == [0, 1]
    assert first_batch(unlimited.run(reqs)) == [0, 1, 2]


def test_padding_options_need_the_v0_scheduler_and_padding() -> None:
    with pytest.raises(ValueError, match="v0_pad_prompts"):
        EngineConfig(v0_pad_prompts=True)
    with pytest.raises(ValueError, match="v0_max_paddings"):
        EngineConfig(scheduler="v0", v0_max_paddings=256)
    with pytest.raises(ValueError, match="v0_max_paddings"):
        EngineConfig(scheduler="v0", v0_pad_prompts=True, v0_max_paddings=-1)


def test_it_needs_recompute_preemption() -> None:
    with pytest.raises(ValueError, match="scheduler='v0'"):
        EngineConfig(scheduler="v0", preemption_mode="offload_dram")
    with pytest.raises(ValueError, match="scheduler='v2'"):
        EngineConfig(scheduler="v2")
