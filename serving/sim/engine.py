"""One engine's discrete-event simulation, mirroring vLLM's scheduler step by step.

`EngineSim.run` loops over iterations (forward passes). At the start of one, at time `now`, timed
changes (capacity changes, reclaims) and arrivals with time <= now join the engine (ordered by
(time, kind, id)); arrivals whose whole sequence could never fit the KV cache are rejected. The
iteration itself is a scheduler step (`EngineSim.step`):
  - `serving.sim.v1.step_v1` (the default, `EngineConfig.scheduler == "v1"`): vLLM V1's chunked
    prefill with decodes first, preemption from the end of the service order, policy rotations
    and prefill caps (serving/sim/v1.py's docstring walks through it);
  - `serving.sim.v0.step_v0` (`scheduler == "v0"`): the paper-era vLLM V0 scheduler (whole prompts
    in prefill-only iterations, a free-block watermark).
Both share serving/sim/iteration.py (queue ordering, admission bookkeeping, preemption for room,
the clock and token accounting at the iteration's end).

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
from serving.policies.base import SchedulingPolicy
from serving.sim.config import EngineConfig
from serving.sim.events import KV_GROW, PEER_CAPACITY, EngineStats, TimedChange
from serving.sim.fastforward import decode_run
from serving.sim.kv import KVCache
from serving.sim.preemption import DramStore, PeerStore
from serving.sim.state import REJECTED, WAITING, SimRequest
from serving.sim.v0 import step_v0, watermark_blocks
from serving.sim.v1 import step_v1
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
        """
        Args:
            cost: Iteration latency model.
            config: Engine limits and preemption mode.
            policy: Scheduling policy.
            store: Where preempted KV goes: optional for offload_dram (host DRAM over PCIe 5 by
                default), required for offload_peer (a PeerStore over the GPU's own NVLink,
                `costmodel.nvlink(gpu)`), unused for recompute.
            on_iteration: Called after every iteration (see `IterationHook`).
        """
        self.cost = cost
        self.config = config
        self.policy = policy
        self.kv = KVCache(config.num_kv_blocks, config.block_size)
        if config.preemption_mode == "recompute":
            self.store = None
        elif config.preemption_mode == "offload_dram":
            self.store = store if store is not None else DramStore()
        elif isinstance(store, PeerStore):
            self.store = store
        else:
            # No default: the lent memory's link is the GPU's own NVLink, which only the caller
            # knows (a default of NVLink 4 priced an A100's offloads at 450 GB/s, not its 300).
            raise ValueError(
                f"preemption_mode='offload_peer' needs store=PeerStore(capacity, costmodel.nvlink(gpu)), "
                f"not {store!r}: lent memory is reached over the GPU's own NVLink"
            )
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
                # V0's watermark grows with the cache: a sequence fitting only under the old one
                # would wait for ever (the engine stalled) once the cache grew.
                wm_tokens = watermark_blocks(self.kv.total) * self.kv.block_size if self._v0 else 0
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
            progressed, plain_decode = self.step()
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

    def step(self) -> tuple[bool, bool]:
        """One scheduler step (one iteration, if anything can be scheduled) at `self.now`.

        Called by `run` once per iteration, after timed changes and arrivals due by `now` joined.
        A driver that interleaves the engine with other simulations calls it directly, having put
        arrivals in `waiting` and adjusted `kv` itself (serving/distserve/prefill.py).

        Returns:
            (anything was scheduled, the iteration was a plain decode-only one).
        """
        return step_v0(self) if self._v0 else step_v1(self)

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


def _arrival_key(r: SimRequest) -> tuple[float, int]:
    return (r.arrival_time, r.req_id)
