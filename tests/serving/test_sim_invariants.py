"""Invariants every policy and engine configuration must keep, over small random workloads.

Checked at every iteration (through the engine's iteration hook) and at the end of a run:
  - each request ends finished, with exactly its output length of tokens, or rejected (counted,
    no token); the tokens computed over the run are exactly each finished request's prompt and
    output (but the last token) plus what recompute preemptions threw away: nothing is lost or
    computed twice across preemptions, offloads and reclaims;
  - the blocks requests hold add up to the cache's used blocks, never above its capacity; offloaded
    KV is accounted in host DRAM and in lent peer memory separately, the lent part never above the
    lent capacity (also after a reclaim); everything is free at the end;
  - simulated time never goes backwards and every latency is ordered and non-negative;
  - the same seed gives the same run.
Policies: every registered one (defaults), EcoServe with a cost model and per-class SLOs, and Aqua
with its shortest time slice; engines: V1 (chunked prefill, all preemption modes, lent memory and
a mid-run reclaim, KV growth) and V0 (with and without prompt padding), with caches small enough
to force preemption.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.costmodel.model import CostModel
from serving.metrics import e2e_latencies, tbts, tpots, ttfts
from serving.metrics.records import RequestRecord
from serving.policies import SchedulingPolicy, available_policies, get_policy
from serving.policies.aqua import AquaFairPolicy
from serving.policies.ecoserve import EcoServePolicy
from serving.sim import KV_GROW, PEER_CAPACITY, ClusterSim, EngineConfig, EngineSim, EngineSpec, Lending
from serving.sim.events import TimedChange
from serving.sim.preemption import PeerStore
from serving.sim.state import RUNNING, WAITING
from serving.sim.v0 import watermark_blocks
from serving.workload.factory import make_workload
from serving.workload.request import Request
from tests.serving.conftest import make_cost, peer_store

# Iterations in a row without a decode: every run here has at most a few hundred (prefills with the
# smallest budget); a livelock (requests evicting each other before any decodes) never stops.
MAX_DECODE_FREE_ITERATIONS = 20_000
KV_BYTES = 1024  # per token: lent capacities below are counted in blocks of block_size x this
POLICIES = [*available_policies(), "ecoserve+cost", "aqua+short-slice"]


def make_policy(name: str, cost: CostModel) -> SchedulingPolicy:
    """A fresh policy (they keep per-run state) by registry name or variant."""
    if name == "ecoserve+cost":
        return EcoServePolicy(ttft_slo_s=0.3, tpot_slo_s=0.03, cost=cost, class_slos={"chat": (0.1, 0.02)})
    if name == "aqua+short-slice":
        return AquaFairPolicy(slice_iters=1)
    return get_policy(name)


@dataclass(frozen=True)
class Setup:
    """An engine configuration and the memory changes it goes through."""

    config: EngineConfig
    changes: tuple[TimedChange, ...]


@st.composite
def setups(draw: st.DrawFn) -> Setup:
    scheduler = draw(st.sampled_from(["v1", "v1", "v0"]))
    # V0 prefills a whole sequence in one iteration: smaller budgets would reject nearly all.
    budgets = [64, 128, 512] if scheduler == "v0" else [8, 32, 128, 512]
    mode = (
        "recompute"
        if scheduler == "v0"
        else draw(st.sampled_from(["recompute", "offload_dram", "offload_peer"]))
    )
    bs = draw(st.sampled_from([1, 4, 16]))
    pad = scheduler == "v0" and draw(st.booleans())
    config = EngineConfig(
        max_num_batched_tokens=draw(st.sampled_from(budgets)),
        max_num_seqs=draw(st.integers(1, 12)),
        block_size=bs,
        num_kv_blocks=max(1, draw(st.integers(48, 480)) // bs),
        preemption_mode=mode,
        fast_forward=draw(st.booleans()),
        scheduler=scheduler,
        v0_pad_prompts=pad,
        v0_max_paddings=draw(st.sampled_from([None, 0, 64])) if pad else None,
    )
    changes = []
    if draw(st.booleans()):  # the lender takes memory back: this engine's cache grows
        changes.append(TimedChange(draw(st.integers(0, 600)) / 1000, KV_GROW, 0, draw(st.integers(0, 30))))
    if mode == "offload_peer":
        lent = draw(st.integers(0, 40)) * bs * KV_BYTES
        config = replace(config, peer_capacity_bytes=lent)
        for k in range(draw(st.integers(0, 2))):  # mid-run reclaims of some of the lent memory
            lent = draw(st.integers(0, lent))
            changes.append(TimedChange(draw(st.integers(0, 600)) / 1000, PEER_CAPACITY, 1 + k, lent))
    return Setup(config, tuple(changes))


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Request], dict[int, int] | None]:
    """1-16 requests (arrival gaps 0-100 ms) and, maybe, noisy length predictions for them."""
    n = draw(st.integers(1, 16))
    item = st.tuples(
        st.integers(0, 100), st.integers(1, 128), st.integers(1, 40), st.sampled_from([None, "chat"])
    )
    items = draw(st.lists(item, min_size=n, max_size=n))
    t = 0.0
    reqs = []
    for i, (gap_ms, prompt, output, slo_class) in enumerate(items):
        t += gap_ms / 1000
        reqs.append(Request(i, t, prompt, output, slo_class))
    if not draw(st.booleans()):
        return reqs, None
    noise = draw(st.lists(st.integers(-20, 20), min_size=len(reqs), max_size=len(reqs)))
    return reqs, {r.req_id: max(1, r.output_tokens + d) for r, d in zip(reqs, noise, strict=True)}


class Checked:
    """Runs an engine, checking its state after every iteration and at the end."""

    def __init__(self, engine: EngineSim) -> None:
        self.engine = engine
        self.end = 0.0  # end time of the last iteration
        self.computed = 0  # tokens computed over the run: prefill chunks + decodes
        self.decode_free = 0  # iterations since the last one that decoded
        engine.on_iteration = self._iteration

    def _iteration(self, start: float, dt: float, prefill: int, decodes: int, xfer: float) -> None:
        assert start >= self.end and dt > 0 and xfer >= 0, "time went backwards or stood still"
        self.end = start + dt
        self.computed += prefill + decodes
        self.decode_free = 0 if decodes else self.decode_free + 1
        assert self.decode_free < MAX_DECODE_FREE_ITERATIONS, f"livelock: {self.engine.running=}"
        self.check_state()

    def check_state(self) -> None:
        e = self.engine
        kv, bs = e.kv, e.kv.block_size
        assert 0 <= kv.free <= kv.total
        assert sum(r.blocks for r in e.running) == kv.total - kv.free, "blocks leaked or double-counted"
        for r in e.running:  # a running request holds exactly the blocks of its computed tokens
            assert r.state == RUNNING and r.blocks == -(-r.computed // bs), r
        assert all(r.state == WAITING and r.blocks == 0 for r in e.waiting)
        if e.store is None:
            return
        saved = [r for r in e.waiting if r.offloaded_bytes]
        block_bytes = bs * e.cost.kv_bytes_per_token
        for r in e.waiting:  # a preempted request's KV is saved whole, never partly
            assert r.offloaded_bytes == -(-r.computed // bs) * block_bytes, r
        assert e.store.used_bytes == sum(r.offloaded_bytes for r in saved if not r.offloaded_in_peer)
        if isinstance(e.store, PeerStore):
            assert e.store.peer_used_bytes == sum(r.offloaded_bytes for r in saved if r.offloaded_in_peer)
            assert e.store.peer_used_bytes <= e.store.capacity_bytes, "lent memory over its capacity"

    def run(
        self,
        reqs: list[Request],
        changes: tuple[TimedChange, ...] = (),
        predictions: dict[int, int] | None = None,
    ) -> list[RequestRecord]:
        e = self.engine
        total0 = e.kv.total
        recs = e.run(reqs, changes=changes, predictions=predictions)
        self.check_state()
        assert not e.running and not e.waiting and e.kv.free == e.kv.total
        if e.store is not None:
            assert e.store.used_bytes == 0
            assert not isinstance(e.store, PeerStore) or e.store.peer_used_bytes == 0
        assert e.stats.end_time == e.now >= self.end
        assert [r.req_id for r in recs] == sorted(r.req_id for r in reqs)
        self.check_records(reqs, recs, total0)
        return recs

    def check_records(self, reqs: list[Request], recs: list[RequestRecord], total0: int) -> None:
        e, cfg = self.engine, self.engine.config
        # An arrival is rejected when the KV of its last token could never fit the cache as it is
        # then (V0: above the watermark, and within the token budget); the cache may grow meanwhile.
        v0 = cfg.scheduler == "v0"
        wm = watermark_blocks(total0) * cfg.block_size if v0 else 0
        seq = cfg.max_num_batched_tokens if v0 else math.inf
        accepted_below = min(total0 * cfg.block_size - wm, seq)
        rejected_above = min(e.kv.total * cfg.block_size - wm, seq)
        by_id = {r.req_id: r for r in reqs}
        work = 0
        rejected = 0
        for rec in recs:
            req = by_id[rec.req_id]
            peak = req.prompt_tokens + req.output_tokens - 1
            if not rec.token_times:
                rejected += 1
                assert peak > accepted_below and rec.preemptions == 0 and rec.bytes_moved == 0
                continue
            assert peak <= rejected_above, "a request was served that could never fit the cache"
            assert len(rec.token_times) == req.output_tokens, "tokens lost or duplicated"
            assert req.arrival <= rec.token_times[0] <= rec.token_times[-1] <= e.stats.end_time
            assert all(a < b for a, b in itertools.pairwise(rec.token_times))
            assert rec.recomputed_tokens >= 0 and rec.bytes_moved >= 0
            if cfg.preemption_mode == "recompute":
                assert rec.bytes_moved == 0
            else:
                assert rec.recomputed_tokens == 0 and (rec.bytes_moved > 0) == (rec.preemptions > 0)
            work += req.prompt_tokens + req.output_tokens - 1 + rec.recomputed_tokens
        assert rejected == e.stats.rejected
        assert self.computed == work, "tokens computed differ from the tokens the requests needed"
        for values in (ttfts(recs), tbts(recs), tpots(recs), e2e_latencies(recs)):
            assert all(v >= 0 and math.isfinite(v) for v in values)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=300, deadline=None)
@given(setup=setups(), workload=workloads())
def test_it_keeps_every_invariant_for_every_policy_and_config(
    policy: str, setup: Setup, workload: tuple[list[Request], dict[int, int] | None]
) -> None:
    reqs, predictions = workload
    cost = make_cost(kv_bytes_per_token=KV_BYTES)
    engine = EngineSim(cost, setup.config, make_policy(policy, cost), store=peer_store(setup.config))
    Checked(engine).run(reqs, setup.changes, predictions)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=8, deadline=None)
@given(setup=setups(), seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["poisson", "gamma", "burst"]))
def test_the_same_seed_gives_the_same_run(policy: str, setup: Setup, seed: int, kind: str) -> None:
    cost = make_cost(kv_bytes_per_token=KV_BYTES)

    def once() -> tuple[list[RequestRecord], object]:
        reqs = make_workload(kind, 20.0, 1.0, seed=seed, max_context=200)
        engine = EngineSim(cost, setup.config, make_policy(policy, cost), store=peer_store(setup.config))
        return Checked(engine).run(reqs, setup.changes), engine.stats

    assert once() == once()


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 64), st.integers(2, 40)), min_size=2, max_size=12),
    block_size=st.sampled_from([1, 4, 16]),
    reclaim_ms=st.integers(0, 300),
    left_blocks=st.integers(0, 20),
)
def test_a_mid_run_reclaim_moves_lent_kv_to_dram_and_loses_none(
    policy: str, lens: list[tuple[int, int]], block_size: int, reclaim_ms: int, left_blocks: int
) -> None:
    # A burst on a cache of 112 tokens preempts, the lent memory takes what is preempted, and the
    # lender reclaims most of it while it is in use (about a quarter of these cases evacuate KV).
    reqs = [Request(i, i / 1000, prompt, output) for i, (prompt, output) in enumerate(lens)]
    config = EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=8,
        block_size=block_size,
        num_kv_blocks=112 // block_size,
        preemption_mode="offload_peer",
        peer_capacity_bytes=2000 * KV_BYTES,
    )
    reclaim = TimedChange(reclaim_ms / 1000, PEER_CAPACITY, 0, left_blocks * 16 * KV_BYTES)
    cost = make_cost(kv_bytes_per_token=KV_BYTES)
    engine = EngineSim(cost, config, make_policy(policy, cost), store=peer_store(config))
    recs = Checked(engine).run(reqs, (reclaim,))
    store = engine.store
    assert isinstance(store, PeerStore) and store.capacity_bytes == left_blocks * 16 * KV_BYTES
    # Every save is restored once (2 moves of the same bytes); evacuated KV moved once more.
    saved_twice = sum(r.bytes_moved for r in recs) - store.evacuated_bytes
    assert saved_twice % (2 * block_size * KV_BYTES) == 0 and store.evacuated_bytes <= saved_twice // 2


@settings(max_examples=15, deadline=None)
@given(
    workload=workloads(),
    policies=st.tuples(st.sampled_from(available_policies()), st.sampled_from(available_policies())),
    lent_blocks=st.integers(0, 40),
    reclaims=st.lists(st.tuples(st.integers(0, 1500), st.integers(0, 100)), max_size=2),
)
def test_a_lending_pair_finishes_everything_and_the_lender_gets_back_what_was_reclaimed(
    workload: tuple[list[Request], dict[int, int] | None],
    policies: tuple[str, str],
    lent_blocks: int,
    reclaims: list[tuple[int, int]],
) -> None:
    reqs, _ = workload
    cost = make_cost(kv_bytes_per_token=KV_BYTES)
    block_bytes = 4 * KV_BYTES
    lent = lent_blocks * block_bytes
    steps, left = [], lent
    for t_ms, pct in sorted(reclaims):  # each reclaim keeps pct% of what is still lent
        left = left * pct // 100
        steps.append((t_ms / 1000, left))
    # 240 tokens of KV: every request fits (prompt + output - 1 <= 167), a few at a time.
    small = EngineConfig(max_num_batched_tokens=64, max_num_seqs=4, block_size=4, num_kv_blocks=60)
    engines = [
        EngineSpec("lender", "s0", (0,), "m", cost, small, policies[0], gpu="h100"),
        EngineSpec(
            "borrower",
            "s0",
            (1,),
            "m",
            cost,
            replace(small, preemption_mode="offload_peer"),
            policies[1],
            gpu="h100",
        ),
    ]
    result = ClusterSim({"s0": 2}, engines, [Lending("lender", "borrower", lent, tuple(steps))]).run(reqs)
    lender, borrower = result.engines["lender"], result.engines["borrower"]
    # The whole blocks of all that was reclaimed (per-reclaim floors lost the fractions).
    assert lender.kv.total == 60 + (lent - left) // block_bytes
    assert isinstance(borrower.store, PeerStore)
    assert borrower.store.capacity_bytes == left and borrower.store.peer_used_bytes == 0
    assert borrower.store.used_bytes == 0 and lender.store is None
    assert all(e.kv.free == e.kv.total and not e.running and not e.waiting for e in (lender, borrower))
    recs = result.all_records()
    assert [r.req_id for r in recs] == [r.req_id for r in reqs]
    assert all(len(rec.token_times) == req.output_tokens for req, rec in zip(reqs, recs, strict=True))


def test_aqua_never_rotates_a_prompt_out_before_its_first_token() -> None:
    # Regression: with recompute preemption and one running slot, a served request (A, preempted
    # after its first token) and a long prompt (B) evicted each other forever. A new arrival, B
    # took A's slot (wakeup preemption); four iterations later A, 16+ tokens of service behind B's
    # half-done prefill, rotated B out; B's prefill was recomputed from scratch, so B was a new
    # arrival again and took A's slot back before A's recompute was done. No token ever came.
    reqs = [Request(0, 0.0, 8, 40), Request(1, 0.001, 100, 2)]
    config = EngineConfig(max_num_batched_tokens=8, max_num_seqs=1, block_size=4, num_kv_blocks=100)
    engine = EngineSim(make_cost(), config, get_policy("aqua"))
    recs = engine.run(reqs, until=30.0)
    assert [len(r.token_times) for r in recs] == [40, 2]
    assert engine.stats.end_time < 1.0 and engine.stats.rotations <= 2  # was 1,111 in 30 s
    # B was rotated out at most after its first token: its whole prompt had been computed.
    assert recs[1].recomputed_tokens in (0, 100)


def test_aqua_needs_a_service_gap_of_at_least_one_token() -> None:
    # With a gap of 0 two equally served requests may rotate each other out in turn; under
    # recompute preemption neither then gets back to a new token.
    with pytest.raises(ValueError, match="min_service_gap"):
        AquaFairPolicy(min_service_gap=0)
