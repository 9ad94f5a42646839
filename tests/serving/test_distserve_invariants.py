"""DistServe invariants over small random workloads and deployments.

- a decode lane pulls a request's KV once, only when it has a free slot and blocks for the whole
  sequence, and never before the KV is ready; its blocks never go below zero or above capacity
  and are all free at the end; every request gets exactly its output tokens, in time order;
- a prefill lane holds a prefilled request's KV until its pull lands: after every step its blocks
  are those of its running requests plus the held ones, within capacity, and all are free at the
  end; each request is prefilled once and released once, never before its pull could have landed;
- a disaggregated deployment (and the co-simulation of any prefill and decode lanes, with prefill
  KV small enough for held KV to block admissions) prefills every request once (on one prefill
  lane) and decodes it fully, with one KV transfer per request that has tokens left to decode;
- the placement each goodput search returns fits the cluster and serves a workload end to end;
- the decode bracket's batch bound is the largest batch whose step fits the TPOT.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.costmodel import CostModel, Link, PhaseCoeffs
from serving.distserve import (
    IB_HDR,
    NVLINK3,
    DecodeLaneSim,
    DisaggDeployment,
    Handoff,
    LaneModel,
    Parallelism,
    PhaseOracle,
    PhaseSpec,
    Placement,
    disagg,
    feasible,
    high_affinity_search,
    lane_model,
    low_affinity_search,
    run_disaggregated,
)
from serving.distserve import oracle as oracle_module
from serving.distserve.disagg import co_simulate
from serving.distserve.oracle import largest_batch
from serving.distserve.prefill import PrefillLaneSim
from serving.metrics.records import RequestRecord
from serving.sim.config import EngineConfig
from serving.workload.request import Request
from tests.serving.conftest import make_cost

MODEL, GPU = "llama-2-13b", "a100"
SLOW = Link("slow", 2e8, 1e-3)  # transfers long enough to overlap decoding and each other


class CheckedLane(DecodeLaneSim):
    """A decode lane whose block count is checked on every change and whose pulls are counted."""

    pulls = 0  # KV pulls by every lane since the last reset (run_decode builds its own lanes)
    max_reads = 100_000  # reads of the free blocks: a run here needs a few thousand at most

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._capacity = -1  # set by the first assignment, in DecodeLaneSim.__init__
        self._free = 0
        self._xfer = 0.0
        self._reads = 0
        super().__init__(*args, **kwargs)

    @property
    def free_blocks(self) -> int:
        self._reads += 1  # the scheduling loop reads them every pass: this bounds a livelock
        assert self._reads < self.max_reads, "decode lane loops without progress"
        return self._free

    @free_blocks.setter
    def free_blocks(self, value: int) -> None:
        if self._capacity < 0:
            self._capacity = value
        assert 0 <= value <= self._capacity, f"decode lane blocks out of range: {value}/{self._capacity}"
        self._free = value

    @property
    def transfer_seconds(self) -> float:
        return self._xfer

    @transfer_seconds.setter
    def transfer_seconds(self, value: float) -> None:
        if value != self._xfer:  # one += per pull, of a positive transfer time
            CheckedLane.pulls += 1
        self._xfer = value

    def finish(self) -> None:
        super().finish()
        assert self.free_blocks == self._capacity, "a finished request kept its blocks"
        assert not self.pending


class CheckedPrefillLane(PrefillLaneSim):
    """A prefill lane whose KV accounting is checked after every step; counts prefills and releases.

    Class attributes (reset by `reset`) gather over every lane a run builds.
    """

    lanes: list[CheckedPrefillLane] = []
    prefilled: Counter[int] = Counter()
    released: Counter[int] = Counter()
    link = NVLINK3  # the link pulls go over, and the KV bytes per token they move
    kv_bytes = 0

    @classmethod
    def reset(cls, link: Link, kv_bytes: int) -> None:
        cls.lanes, cls.prefilled, cls.released = [], Counter(), Counter()
        cls.link, cls.kv_bytes = link, kv_bytes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        CheckedPrefillLane.lanes.append(self)
        self._by_id = {r.req_id: r for r in self.records}

    def step(self) -> list[RequestRecord]:
        done = super().step()
        kv = self.engine.kv
        running = sum(r.blocks for r in self.engine.running)
        assert 0 <= kv.free <= kv.total, f"prefill blocks out of range: {kv.free}/{kv.total}"
        assert kv.total - kv.free == running + self.held_blocks, "held KV not counted against capacity"
        for rec in done:
            assert rec.token_times == [self.engine.now], "a prefill ends with its first token"
        CheckedPrefillLane.prefilled.update(r.req_id for r in done)
        return done

    def release(self, req_id: int, at: float) -> None:
        rec = self._by_id[req_id]
        # The pull starts no earlier than the first token and lasts the prompt's KV transfer.
        transfer = self.link.seconds(rec.prompt_tokens * self.kv_bytes)
        assert rec.token_times and at >= rec.token_times[0] + transfer, "pulled before its KV was ready"
        CheckedPrefillLane.released[req_id] += 1
        super().release(req_id, at)

    @classmethod
    def check_all_freed(cls) -> None:
        for lane in cls.lanes:
            kv = lane.engine.kv
            assert kv.free == kv.total and lane.held_blocks == 0 and not lane.pending, "KV left held"


def check_decoded(handoffs: Sequence[Handoff], kv_bytes: int, link: Link, max_batch: int) -> None:
    """Every handed-off request decoded fully, after its KV landed, in batches of <= max_batch."""
    for h in handoffs:
        rec = h.record
        t = rec.token_times
        assert len(t) == rec.output_tokens, "tokens lost or duplicated"
        assert all(a < b for a, b in itertools.pairwise(t))
        if len(t) > 1:  # the second token comes after the KV was pulled (after it was ready)
            assert t[1] > h.ready + link.seconds(rec.prompt_tokens * kv_bytes)
    # The requests decoding in one iteration all get a token at its end: at most max_num_seqs.
    batch = Counter(x for h in handoffs for x in h.record.token_times[1:])
    assert max(batch.values(), default=0) <= max_batch


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.integers(0, 300), st.integers(1, 200), st.integers(1, 60)), min_size=1, max_size=20
    ),
    kv_blocks=st.integers(16, 60),
    max_num_seqs=st.integers(1, 8),
    link=st.sampled_from([SLOW, NVLINK3]),
)
def test_a_decode_lane_pulls_each_kv_once_when_it_has_room_and_decodes_it_fully(
    items: list[tuple[int, int, int]], kv_blocks: int, max_num_seqs: int, link: Link
) -> None:
    cost = make_cost(kv_bytes_per_token=4096)
    # Sequences up to 260 tokens (17 blocks): a lane of 16-60 blocks holds one to a few of them.
    handoffs = []
    for i, (ready_ms, prompt, output) in enumerate(items):
        rec = RequestRecord(i, ready_ms / 2000, prompt, output, [ready_ms / 1000])
        handoffs.append(Handoff(ready_ms / 1000, rec))
    fits = [h for h in handoffs if -(-(h.record.prompt_tokens + h.record.output_tokens) // 16) <= kv_blocks]
    CheckedLane.pulls = 0
    lane = CheckedLane(cost, kv_blocks * 16, link, max_num_seqs=max_num_seqs)
    if len(fits) < len(handoffs):
        with pytest.raises(ValueError, match="can never fit"):
            lane.run(handoffs)
        return
    lane.run(handoffs)
    check_decoded(handoffs, cost.kv_bytes_per_token, link, max_num_seqs)
    assert CheckedLane.pulls == sum(1 for h in handoffs if h.record.output_tokens > 1)


@settings(max_examples=12, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.integers(0, 100), st.integers(1, 1024), st.integers(1, 64)), min_size=1, max_size=24
    ),
    prefill=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.integers(1, 2)),
    decode=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.integers(1, 2)),
    decode_max_seqs=st.integers(1, 6),
    prefill_max_tokens=st.sampled_from([256, 1024]),
    kv_link=st.sampled_from([NVLINK3, IB_HDR, SLOW]),
)
def test_a_disaggregated_run_prefills_once_transfers_once_and_decodes_fully(
    items: list[tuple[int, int, int]],
    prefill: tuple[int, int, int],
    decode: tuple[int, int, int],
    decode_max_seqs: int,
    prefill_max_tokens: int,
    kv_link: Link,
) -> None:
    t = 0.0
    reqs = []
    for i, (gap_ms, prompt, output) in enumerate(items):
        t += gap_ms / 1000
        reqs.append(Request(i, t, prompt, output))
    CheckedLane.pulls = 0
    p_spec, d_spec = (PhaseSpec(Parallelism(tp, pp), n) for tp, pp, n in (prefill, decode))
    d_lane = lane_model(MODEL, GPU, d_spec.par)
    CheckedPrefillLane.reset(kv_link, d_lane.cost.kv_bytes_per_token)
    dep = DisaggDeployment(
        MODEL,
        GPU,
        p_spec,
        d_spec,
        kv_link,
        prefill_max_tokens=prefill_max_tokens,
        decode_max_seqs=decode_max_seqs,
    )
    with pytest.MonkeyPatch.context() as mp:  # (a fixture would not be reset between examples)
        mp.setattr(disagg, "PrefillLaneSim", CheckedPrefillLane)
        mp.setattr(disagg, "DecodeLaneSim", CheckedLane)
        recs = run_disaggregated(reqs, dep)
    assert [r.req_id for r in recs] == [r.req_id for r in reqs]
    for req, rec in zip(reqs, recs, strict=True):
        assert rec.token_times and rec.recomputed_tokens == 0
        assert req.arrival <= rec.token_times[0]
    lanes = d_lane.lanes * d_spec.instances  # (their iterations may end at the same times)
    check_co_simulated(reqs, recs, d_lane.cost.kv_bytes_per_token, kv_link, decode_max_seqs * lanes)


def check_co_simulated(
    reqs: Sequence[Request], recs: Sequence[RequestRecord], kv_bytes: int, link: Link, max_batch: int
) -> None:
    """Every served request prefilled once, pulled and released once (if it decodes), decoded fully."""
    served = [r for r in recs if r.token_times]  # (a prompt that never fits a prefill lane gets none)
    assert CheckedPrefillLane.prefilled == Counter(r.req_id for r in served), "prefilled twice or never"
    pulled = Counter(r.req_id for r in served if r.output_tokens > 1)
    assert CheckedPrefillLane.released == pulled, "a KV was released twice or never"
    assert CheckedLane.pulls == len(pulled)
    CheckedPrefillLane.check_all_freed()
    check_decoded([Handoff(r.token_times[0], r) for r in served], kv_bytes, link, max_batch)
    assert len(recs) == len(reqs)


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=30
    ),
    prefill_lanes=st.integers(1, 2),
    prefill_blocks=st.integers(8, 48),
    prefill_budget=st.sampled_from([32, 128, 512]),
    decode_lanes=st.integers(1, 2),
    decode_blocks=st.integers(22, 60),
    max_num_seqs=st.integers(1, 4),
    link=st.sampled_from([SLOW, NVLINK3]),
)
def test_co_simulated_prefill_lanes_hold_kv_until_pulled_within_capacity(
    items: list[tuple[int, int, int]],
    prefill_lanes: int,
    prefill_blocks: int,
    prefill_budget: int,
    decode_lanes: int,
    decode_blocks: int,
    max_num_seqs: int,
    link: Link,
) -> None:
    # Prompts up to 300 tokens (19 blocks) on prefill lanes of 8-48 blocks: held KV of one to a few
    # requests fills a lane (and a prompt above its capacity is rejected); sequences up to 340
    # tokens (22 blocks) always fit a decode lane.
    cost = make_cost(kv_bytes_per_token=4096)
    t = 0.0
    reqs = []
    for i, (gap_ms, prompt, output) in enumerate(items):
        t += gap_ms / 1000
        reqs.append(Request(i, t, prompt, output))
    CheckedLane.pulls = 0
    CheckedPrefillLane.reset(link, cost.kv_bytes_per_token)
    config = EngineConfig(max_num_batched_tokens=prefill_budget, num_kv_blocks=prefill_blocks)
    prefills = [CheckedPrefillLane(cost, config, reqs[k::prefill_lanes]) for k in range(prefill_lanes)]
    decodes = [
        CheckedLane(cost, decode_blocks * 16, link, max_num_seqs=max_num_seqs) for _ in range(decode_lanes)
    ]
    co_simulate(prefills, decodes)
    recs = sorted((r for p in prefills for r in p.records), key=lambda r: r.req_id)
    for req, rec in zip(reqs, recs, strict=True):
        fits = req.prompt_tokens <= prefill_blocks * 16
        assert bool(rec.token_times) == fits, "a prompt that fits was not served, or one that cannot was"
    check_co_simulated(reqs, recs, cost.kv_bytes_per_token, link, max_num_seqs * decode_lanes)


def test_a_decode_lane_refuses_offers_out_of_ready_order() -> None:
    lane = DecodeLaneSim(make_cost(), 512, SLOW)
    lane.offer(Handoff(1.0, RequestRecord(1, 0.0, 8, 4, [1.0])))
    with pytest.raises(ValueError, match="request 0 offered out of"):
        lane.offer(Handoff(0.5, RequestRecord(0, 0.0, 8, 4, [0.5])))


def test_a_prefill_lane_refuses_a_release_of_kv_it_does_not_hold() -> None:
    lane = PrefillLaneSim(make_cost(), EngineConfig(num_kv_blocks=64), [Request(0, 0.0, 40, 4)])
    with pytest.raises(ValueError, match="request 7 holds no KV"):
        lane.release(7, 1.0)
    while lane.next_time() < float("inf"):
        lane.step()
    assert lane.held_blocks == 3  # 40 prompt tokens in 16-token blocks, held until released
    lane.release(0, 2.0)
    with pytest.raises(ValueError, match="request 0 holds no KV"):
        lane.release(0, 3.0)
    lane.step()
    assert lane.engine.now == 2.0 and lane.held_blocks == 0 and not lane.pending


def small_workload(rate: float) -> list[Request]:
    """40 arrivals at mean `rate` (a fixed pattern of gaps), 256-token prompts, 16-token outputs."""
    reqs, t = [], 0.0
    gaps = [0.3, 1.7, 0.9, 1.1, 0.5, 1.5, 0.8, 1.2]  # mean 1
    for i in range(40):
        t += gaps[i % len(gaps)] / rate
        reqs.append(Request(i, t, 256, 16))
    return reqs


def check_placement(p: Placement, nodes: int, gpus_per_node: int) -> None:
    assert p.units >= 1 and p.gpus <= nodes * gpus_per_node and p.per_gpu_goodput > 0
    assert feasible(MODEL, GPU, p.prefill.par) and feasible(MODEL, GPU, p.decode.par)
    if p.kind == "low":  # one pipeline depth; a node holds both phases' stage segments
        assert p.prefill.par.pp == p.decode.par.pp
        assert p.prefill.instances * p.prefill.par.tp + p.decode.instances * p.decode.par.tp <= gpus_per_node
    dep = DisaggDeployment(MODEL, GPU, p.prefill, p.decode, p.kv_link, p.stage_link)
    rate = p.per_gpu_goodput * (p.prefill.gpus + p.decode.gpus)  # the unit's estimated goodput
    reqs = small_workload(rate)
    recs = run_disaggregated(reqs, dep)
    assert all(len(r.token_times) == q.output_tokens for q, r in zip(reqs, recs, strict=True))


@pytest.mark.parametrize("kind", ["high", "low"])
@pytest.mark.parametrize(("ttft_s", "tpot_s"), [(0.2, 0.05), (0.05, 0.2)])
def test_the_goodput_searches_return_a_placement_the_simulator_serves(
    kind: str, ttft_s: float, tpot_s: float
) -> None:
    oracle = PhaseOracle(MODEL, GPU, small_workload, ttft_s, tpot_s, rel_tol=0.1)
    if kind == "high":
        check_placement(high_affinity_search(oracle, nodes=1, gpus_per_node=4, max_pp=2), 1, 4)
    else:
        check_placement(low_affinity_search(oracle, nodes=2, gpus_per_node=4, max_pp=2), 2, 4)


def test_an_idle_decode_lane_waits_for_a_landing_when_the_ready_request_lacks_blocks() -> None:
    # Regression: A's pull holds 1 of the lane's 2 blocks while its KV is in flight; B is ready but
    # needs both. Idle, the lane took B's (past) ready time as its next event, so the clock never
    # moved to A's landing and the run never ended.
    a = RequestRecord(0, 0.0, 8, 2, [0.0])
    b = RequestRecord(1, 0.0, 20, 2, [0.0])
    lane = CheckedLane(make_cost(), 32, SLOW)
    lane.run([Handoff(0.0, a), Handoff(0.0, b)])
    landed = SLOW.seconds(8 * make_cost().kv_bytes_per_token)
    assert landed < a.token_times[1] < b.token_times[1]  # B is pulled only once A has finished


@settings(max_examples=200, deadline=None)
@given(
    a=st.floats(0.0, 0.05),
    b=st.floats(0.0, 1e-6),
    c=st.floats(1e-6, 1e-3),
    context=st.integers(1, 8192),
    limit=st.floats(1e-4, 2.0),
)
def test_the_decode_bracket_batch_is_the_largest_that_fits_the_tpot(
    a: float, b: float, c: float, context: int, limit: float
) -> None:
    # The oracle scanned k = 2, 3, ... building a list of k contexts per try (quadratic: a TPOT of
    # 1000 s would have scanned ~2 million batches); the search must give the scan's answer.
    cost = CostModel(PhaseCoeffs(a, b, c), PhaseCoeffs(a, b, c), 1)
    scan = 1
    while scan < 5000 and cost.decode_time([context] * (scan + 1)) <= limit:
        scan += 1
    if scan < 5000:
        assert largest_batch(cost.decode, context, limit) == scan


def test_a_loose_tpot_bounds_the_batch_without_scanning_it() -> None:
    d = PhaseCoeffs(0.017, 2.5e-7, 1.7e-4)  # about llama-2-13b@a100
    k = largest_batch(d, 544, 1000.0)  # ~2.3 million: the scan would take hours (extrapolated)
    assert d.a + d.b * 544 * k + d.c * k <= 1000.0 < d.a + d.b * 544 * (k + 1) + d.c * (k + 1)
    with pytest.raises(ValueError, match="does not grow"):  # no other bound given
        largest_batch(PhaseCoeffs(0.01, 0.0, 0.0), 544, 1.0)


def test_a_flat_decode_step_is_bounded_by_the_lanes_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fit of flat decode samples (per-token and per-sequence slopes 0) made largest_batch raise
    # "does not grow", and with it the oracle's decode bracket: the search could not run.
    flat = PhaseCoeffs(0.02, 0.0, 0.0)
    cost = CostModel(PhaseCoeffs(0.02, 1e-5, 0.0), flat, 1, "fitted")
    monkeypatch.setattr(oracle_module, "lane_model", lambda *_: LaneModel(cost, 1, 264 * 4))
    oracle = PhaseOracle(MODEL, GPU, small_workload, 0.25, 0.1)
    # KV for 4 requests of 256 + 16 / 2 tokens: the bracket starts at 1.2 x 4 / (0.1 s x 16 tokens)
    # = 3 req/s and widens; past ~14 req/s requests queue for KV long enough to miss the TPOT.
    assert 3.0 < oracle.decode(Parallelism(1, 1), NVLINK3, NVLINK3) < 24.0
    assert largest_batch(flat, 544, 0.1, max_batch=100) == 100
    assert largest_batch(flat, 544, 0.01, max_batch=100) == 1  # not even two fit
    assert largest_batch(PhaseCoeffs(0.02, 0.0, 1e-3), 544, 0.1, max_batch=10) == 80  # the TPOT's


def test_the_oracle_tells_apart_links_that_share_a_name() -> None:
    # Brackets were memoised by the links' names: a decode instance pulling KV over a link named
    # "ib" at 25 GB/s and over another "ib" at 2 MB/s got the first one's goodput.
    oracle = PhaseOracle(MODEL, GPU, small_workload, 0.25, 0.1)
    one = Parallelism(1, 1)
    fast = oracle.decode(one, NVLINK3, Link("ib", 25e9))
    slow = oracle.decode(one, NVLINK3, Link("ib", 2e6, 0.05))
    assert slow < fast
    assert oracle.decode(one, NVLINK3, Link("ib", 25e9)) == fast  # equal links still share one
    two = Parallelism(1, 2)
    assert oracle.prefill(two, Link("st", 1e6, 0.05)) < oracle.prefill(two, Link("st", 300e9))
