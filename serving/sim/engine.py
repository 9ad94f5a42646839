"""One engine's discrete-event simulation, mirroring vLLM V1's scheduler step by step.

An iteration (one forward pass), at time `now`:
  1. Timed changes (capacity changes, reclaims) and arrivals with time <= now join the engine
     (ordered by (time, kind, id)); arrivals whose whole sequence could never fit the KV cache are
     rejected.
  2. The policy orders the running and waiting requests and may pick rotations, which are
     preempted at once (they queue behind the waiting requests for this iteration).
  3. Running requests are scheduled in service order: each gets its decode token or its next
     prefill chunk (prefill tokens limited by the policy's prefill cap and the token budget). When
     a KV block allocation fails, the LAST request of the service order is preempted, repeatedly
     until the allocation fits; a request that is itself last preempts itself and scheduling of
     running requests stops (vLLM V1).
  4. If no allocation failed, waiting requests are admitted in the policy's order while budget,
     blocks and sequence slots last (and at most `policy.admission_limit(...)` of them); the first
     that does not fit stops admission (vLLM V1: no admission in a step that preempted).
  5. The iteration lasts `CostModel.iteration_time(chunks, decode contexts)` plus the transfer
     time of any KV saved or restored in it; every request whose sequence is then fully computed
     emits a token at the iteration's end.

With `EngineConfig.scheduler == "v0"` each iteration is `serving.sim.v0.step_v0` instead: the
paper-era vLLM V0 scheduler (whole prompts in prefill-only iterations, a free-block watermark).

Fast forward: when an iteration was decode-only and changed nothing but token counts, and the
policy declares `decode_invariant = True` (its decisions cannot change while only output counts
and time advance), the following identical iterations up to the next arrival, finish or block
shortage are computed in one go by `fastforward.decode_run` (same float operations, so the records
are bit-identical to stepping; a test checks this).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping

from serving.costmodel.model import CostModel
from serving.metrics.records import RequestRecord
from serving.policies.base import SchedContext, SchedulingPolicy
from serving.sim.config import EngineConfig
from serving.sim.events import KV_GROW, PEER_CAPACITY, EngineStats, TimedChange
from serving.sim.fastforward import decode_run
from serving.sim.kv import KVCache
from serving.sim.preemption import DramStore, PeerStore
from serving.sim.state import FINISHED, REJECTED, RUNNING, WAITING, SimRequest
from serving.sim.v0 import step_v0, watermark_blocks
from serving.workload.request import Request

# Called after every iteration with (start, duration, prefill tokens, decodes, transfer seconds).
IterationHook = Callable[[float, float, int, int, float], None]


class EngineSim:
    """Simulates one vLLM-like engine serving one model under one scheduling policy."""

    def __init__(
        self,
        cost: CostModel,
        config: EngineConfig,
        policy: SchedulingPolicy,
        *,
        store: DramStore | None = None,
        on_iteration: IterationHook | None = None,
    ) -> None:
        self.cost = cost
        self.config = config
        self.policy = policy
        self.kv = KVCache(config.num_kv_blocks, config.block_size)
        if config.preemption_mode == "recompute":
            self.store = None
        elif config.preemption_mode == "offload_dram":
            self.store = store if store is not None else DramStore()
        else:
            self.store = store if store is not None else PeerStore(config.peer_capacity_bytes)
        self.on_iteration = on_iteration
        self.now = 0.0
        self.running: list[SimRequest] = []  # service order of the last iteration
        self.waiting: list[SimRequest] = []  # arrival order (preempted ones re-inserted in place)
        self.stats = EngineStats()
        self._admissions = 0
        self._pending_xfer = 0.0  # transfer seconds to add to the next iteration (reclaims)
        self._block_bytes = config.block_size * cost.kv_bytes_per_token
        # A policy that keeps the base prefill cap (the whole budget) need not be asked for it.
        self._default_cap = type(policy).prefill_token_cap is SchedulingPolicy.prefill_token_cap
        self._fast_forward = config.fast_forward and policy.decode_invariant
        self._v0 = config.scheduler == "v0"

    def run(
        self,
        requests: Iterable[Request],
        *,
        changes: Iterable[TimedChange] = (),
        until: float | None = None,
        progress: Callable[[float], None] | None = None,
        predictions: Mapping[int, int] | None = None,
    ) -> list[RequestRecord]:
        """Serve `requests` until all finish (or until the time `until`).

        `predictions` (req_id -> predicted output tokens, from a response-length predictor) is
        exposed to the policy as `SchedRequest.predicted_output_tokens`; absent ids read None.

        Returns:
            One record per request, in request-id order.
        """
        pred = predictions or {}
        ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
        reqs = [SimRequest(r, pred.get(r.req_id)) for r in ordered]
        evs = sorted(changes, key=lambda c: (c.time, c.kind, c.event_id))
        na, ne, ai, ei = len(reqs), len(evs), 0, 0
        inf = float("inf")
        horizon = inf if until is None else until
        cap_tokens = self.kv.total * self.kv.block_size
        # V0 prefills a (recomputed) sequence in one iteration, so it must fit the token budget,
        # and never admits below its watermark of free blocks.
        seq_limit = self.config.max_num_batched_tokens if self._v0 else inf
        wm_tokens = watermark_blocks(self.kv.total) * self.kv.block_size if self._v0 else 0
        last_progress = -inf
        while True:
            now = self.now
            if progress is not None and now - last_progress >= 1.0:
                last_progress = now
                progress(now)
            while ei < ne and evs[ei].time <= now:
                self._apply(evs[ei])
                cap_tokens = self.kv.total * self.kv.block_size
                ei += 1
            while ai < na and reqs[ai].arrival_time <= now:
                r = reqs[ai]
                ai += 1
                # The peak KV a request needs is its whole sequence but the last token.
                peak = r.num_prompt_tokens + r.target_output_tokens - 1
                if peak > cap_tokens - wm_tokens or peak > seq_limit:
                    r.state = REJECTED
                    self.stats.rejected += 1
                else:
                    self.waiting.append(r)
            if now >= horizon:
                break
            next_t = min(reqs[ai].arrival_time if ai < na else inf, evs[ei].time if ei < ne else inf)
            if not self.running and not self.waiting:
                if next_t == inf:
                    break
                self.now = max(now, min(next_t, horizon))
                continue
            if self._fast_forward and not self.waiting and not self._pending_xfer:
                # Nobody waits: if every running request decodes, the policy cannot change
                # anything (decode_invariant) and its round can be skipped; decode_run checks.
                k = decode_run(self, min(next_t, horizon))
                if k:
                    self.stats.fast_forwarded_iterations += k
                    continue
            progressed, plain_decode = step_v0(self) if self._v0 else self._step()
            if not progressed:
                if next_t == inf and horizon < inf:
                    # Nothing can run before the horizon; a later run() may bring arrivals.
                    self.now = max(now, horizon)
                    continue
                if next_t == inf:
                    raise RuntimeError(
                        f"engine stalled at t={now:.6f}s: policy {self.policy.name!r} scheduled nothing "
                        f"with {len(self.running)} running and {len(self.waiting)} waiting"
                    )
                self.now = max(now, next_t)
            elif plain_decode and self._fast_forward:
                k = decode_run(self, min(next_t, horizon))
                self.stats.fast_forwarded_iterations += k
        self.stats.end_time = self.now
        return [r.record for r in sorted(reqs, key=lambda r: r.req_id)]

    def _apply(self, change: TimedChange) -> None:
        if change.kind == KV_GROW:
            self.kv.grow(change.value)
        elif change.kind == PEER_CAPACITY:
            if not isinstance(self.store, PeerStore):
                raise ValueError("a peer-capacity change needs preemption_mode='offload_peer'")
            self._pending_xfer += self.store.set_capacity(change.value)
        else:
            raise ValueError(f"unknown {change.kind=}")

    def _preempt(self, r: SimRequest) -> float:
        """Take `r` off the GPU (recompute: drop its KV; offload: save it); returns transfer seconds."""
        seconds = 0.0
        if self.store is None:
            r.record.recomputed_tokens += r.computed
            r.computed = 0
        else:
            seconds = self.store.save(r, r.blocks * self._block_bytes)
        self.kv.free += r.blocks
        r.blocks = 0
        r.state = WAITING
        r.num_preemptions += 1
        r.record.preemptions += 1
        self.stats.preemptions += 1
        bisect.insort(self.waiting, r, key=_arrival_key)
        return seconds

    def _step(self) -> tuple[bool, bool]:
        """One iteration. Returns (anything scheduled, plain decode-only iteration with no changes)."""
        cfg = self.config
        kv = self.kv
        bs = kv.block_size
        policy = self.policy
        budget = cfg.max_num_batched_tokens
        ctx = SchedContext(self.now, self.stats.iterations, budget, kv.free, kv.total, bs, cfg.max_num_seqs)
        running = list(policy.order_running(self.running, ctx))
        waiting = list(policy.order_waiting(self.waiting, ctx)) if self.waiting else []
        rotated = policy.select_rotations(running, waiting, ctx)
        xfer = self._pending_xfer
        self._pending_xfer = 0.0
        if rotated:
            gone = {id(r) for r in rotated}
            if len(gone) != len(rotated) or any(r.state != RUNNING for r in rotated):
                raise ValueError(f"policy {policy.name!r} rotated requests that are not running, or twice")
            running = [r for r in running if id(r) not in gone]
            for r in rotated:
                xfer += self._preempt(r)
            waiting.extend(rotated)  # they yield, this iteration, to requests already waiting
            self.stats.rotations += len(rotated)
        if self._default_cap:
            pbudget = budget  # the base class's cap: the whole budget (the call has no effect)
        else:
            ndec = 0
            for r in running:
                if r.num_output_tokens and r.computed == r.num_prompt_tokens + r.num_output_tokens - 1:
                    ndec += 1
            pbudget = min(max(policy.prefill_token_cap(ctx, ndec), 0), budget)

        decs: list[SimRequest] = []  # requests decoding one token this iteration
        dctx: list[int] = []  # their context lengths
        pres: list[SimRequest] = []  # requests prefilling a chunk this iteration
        chunks: list[int] = []  # their chunk lengths
        preempted = False
        i = 0
        while i < len(running):
            r = running[i]
            seq = r.num_prompt_tokens + r.num_output_tokens
            new = seq - r.computed
            if new == 1 and r.num_output_tokens:
                if budget < 1:
                    i += 1
                    continue
                is_decode = True
                need = (seq + bs - 1) // bs - r.blocks
                if need <= 0:  # hot path: the token fits in the request's last block
                    decs.append(r)
                    dctx.append(seq)
                    budget -= 1
                    i += 1
                    continue
            else:
                new = min(new, budget, pbudget)
                if new <= 0:
                    i += 1
                    continue
                is_decode = False
                need = (r.computed + new + bs - 1) // bs - r.blocks
            while need > kv.free:
                victim = running.pop()
                xfer += self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.state != RUNNING:
                break
            kv.free -= need
            r.blocks += need
            budget -= new
            if is_decode:
                decs.append(r)
                dctx.append(seq)
            else:
                pbudget -= new
                pres.append(r)
                chunks.append(new)
            i += 1

        admitted = 0
        if not preempted and waiting:
            slots = cfg.max_num_seqs - len(running)
            limit = policy.admission_limit(running, waiting, ctx)
            if limit is not None:
                slots = min(slots, limit)
            for r in waiting:
                if slots <= 0 or budget <= 0:
                    break
                seq = r.num_prompt_tokens + r.num_output_tokens
                new = seq - r.computed
                is_decode = new == 1 and r.num_output_tokens > 0
                if not is_decode:
                    new = min(new, budget, pbudget)
                    if new <= 0:
                        break
                need = (r.computed + new + bs - 1) // bs
                if need > kv.free:
                    break
                if r.offloaded_bytes and self.store is not None:
                    xfer += self.store.restore(r)
                kv.free -= need
                r.blocks = need
                r.state = RUNNING
                r.admission_seq = self._admissions
                self._admissions += 1
                running.append(r)
                slots -= 1
                admitted += 1
                budget -= new
                if is_decode:
                    decs.append(r)
                    dctx.append(seq)
                else:
                    pbudget -= new
                    pres.append(r)
                    chunks.append(new)
            if admitted:
                self.waiting = [r for r in self.waiting if r.state == WAITING]

        if not decs and not pres and xfer == 0.0:
            self.running = running
            return False, False
        dt = self.cost.iteration_time(chunks, dctx)
        if xfer:
            dt += xfer
            self.stats.transfer_seconds += xfer
        start = self.now
        now = start + dt
        self.now = now
        self.stats.iterations += 1
        finished = 0
        for r in decs:  # a decode always completes the sequence: one more token
            r.computed += 1
            out = r.num_output_tokens + 1
            r.num_output_tokens = out
            r.token_times.append(now)
            if out == r.target_output_tokens:
                r.state = FINISHED
                kv.free += r.blocks
                r.blocks = 0
                finished += 1
        for r, new in zip(pres, chunks, strict=True):
            r.computed += new
            if r.computed == r.num_prompt_tokens + r.num_output_tokens:  # last chunk: first token
                r.num_output_tokens += 1
                r.token_times.append(now)
                if r.num_output_tokens == r.target_output_tokens:
                    r.state = FINISHED
                    kv.free += r.blocks
                    r.blocks = 0
                    finished += 1
        self.running = [r for r in running if r.state == RUNNING] if finished else running
        if self.on_iteration is not None:
            self.on_iteration(start, dt, sum(chunks), len(dctx), xfer)
        plain = not (chunks or rotated or preempted or admitted or finished or xfer) and len(dctx) == len(
            running
        )
        return True, plain


def _arrival_key(r: SimRequest) -> tuple[float, int]:
    return (r.arrival_time, r.req_id)
