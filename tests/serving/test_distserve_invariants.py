"""DistServe invariants over small random workloads and deployments.

- a decode lane pulls a request's KV once, only when it has a free slot and blocks for the whole
  sequence, and never before the KV is ready; its blocks never go below zero or above capacity
  and are all free at the end; every request gets exactly its output tokens, in time order;
- a disaggregated deployment prefills every request once (on one prefill lane) and decodes it
  fully, with one KV transfer per request that has tokens left to decode;
- the placement each goodput search returns fits the cluster and serves a workload end to end.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.costmodel import Link
from serving.distserve import (
    IB_HDR,
    NVLINK3,
    DecodeLaneSim,
    DisaggDeployment,
    Handoff,
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
from serving.metrics.records import RequestRecord
from serving.sim.engine import EngineSim
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

    def run(self, handoffs: list[Handoff]) -> None:
        super().run(handoffs)
        assert self.free_blocks == self._capacity, "a finished request kept its blocks"


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
    prefilled: Counter[int] = Counter()

    class CountingEngine(EngineSim):
        def run(self, requests: Iterable[Request], **kw: Any) -> list[RequestRecord]:
            requests = list(requests)
            prefilled.update(r.req_id for r in requests)
            return super().run(requests, **kw)

    CheckedLane.pulls = 0
    p_spec, d_spec = (PhaseSpec(Parallelism(tp, pp), n) for tp, pp, n in (prefill, decode))
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
        mp.setattr(disagg, "EngineSim", CountingEngine)
        mp.setattr(disagg, "DecodeLaneSim", CheckedLane)
        recs = run_disaggregated(reqs, dep)
    assert prefilled == Counter(r.req_id for r in reqs), "a request was prefilled twice or never"
    assert [r.req_id for r in recs] == [r.req_id for r in reqs]
    for req, rec in zip(reqs, recs, strict=True):
        assert rec.token_times and rec.recomputed_tokens == 0
        assert req.arrival <= rec.token_times[0]
    d_lane = lane_model(MODEL, GPU, d_spec.par)
    lanes = d_lane.lanes * d_spec.instances  # (their iterations may end at the same times)
    check_decoded(
        [Handoff(r.token_times[0], r) for r in recs],
        d_lane.cost.kv_bytes_per_token,
        kv_link,
        decode_max_seqs * lanes,
    )
    assert CheckedLane.pulls == sum(1 for r in reqs if r.output_tokens > 1)


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
