"""AquaScheduler: vLLM 0.32's V1 scheduler driven by a `SchedulingPolicy` (default `aqua`).

Load it with `LLM(..., scheduler_cls="serving.vllm_ext.scheduler.AquaScheduler")` (the module must
be importable in the engine process). Options, from `--additional-config` (JSON) or the
environment:

    aqua_policy          / AQUA_POLICY        policy name (default "aqua"; any registered policy)
    aqua_slice_iters     / AQUA_SLICE_ITERS   the aqua policy's time slice, in iterations
    aqua_max_wait_iters  / AQUA_MAX_WAIT_ITERS the aqua policy's bound on a served request's wait,
                                              in iterations (its aging guard)
    aqua_policy_options                       extra policy constructor options (dict)
    aqua_stats_dir       / AQUA_STATS_DIR     where scheduler.json (counters) is written

Each step, before vLLM's own `schedule()`:
  1. running and waiting requests are wrapped (VllmRequestView) and ordered by the policy;
     `self.running` is rewritten in service order, so vLLM's victim on an allocation failure
     (`self.running[-1]`) is the policy's, and `self.waiting` in admission order;
  2. the policy's rotations are preempted through vLLM's own `_preempt_request` (after removing
     them from `self.running`), which frees their blocks and reports their ids to the KV
     connector; waiting is then re-ordered so they queue behind the requests they yield to;
  3. a policy's `prefill_token_cap` below the step's token budget caps the step's prefill tokens
     (`_apply_prefill_cap`): vLLM's per-step budget (`max_num_scheduled_tokens`, which
     `schedule()` reads once as `token_budget`) becomes the running decodes' tokens (speculative
     ones included) plus the cap, and prefill chunks of running requests served before a decode
     share the cap among themselves (`_reserve_prefill_lookahead`, vLLM's last clamp of a
     request's tokens), so they cannot take the decodes' share. The budget is restored afterwards
     (docs/ecoserve-vllm.md: what this maps exactly, and what it does not);
  4. for a policy with an `admission_limit` (e.g. EcoServe's KV reservation and late-request
     gate), the waiting requests past the limit are taken out of `self.waiting` for the duration
     of vLLM's `schedule()` and put back behind the others, so vLLM admits at most the limit.
     Requests that already hold KV blocks wait in vLLM's separate `kv_holding_waiting` queue
     (e.g. async KV loads) and are not gated.
Per-request predictions and SLO classes come from `SamplingParams.extra_args` (request_view.py).
Requires the FCFS request queue (`scheduling_policy="fcfs"`, vLLM's default).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.request_queue import SchedulingPolicy as QueuePolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from serving.aqua.offload.stats import StatsFile
from serving.policies.base import SchedContext, SchedulingPolicy
from serving.policies.registry import get_policy
from serving.vllm_ext.request_view import VllmRequestView

logger = logging.getLogger(__name__)


def policy_from_config(additional: dict[str, Any] | None) -> SchedulingPolicy:
    """Build the policy named in vLLM's additional_config, else the environment, else `aqua`."""
    extra = dict(additional or {})
    name = str(extra.get("aqua_policy") or os.environ.get("AQUA_POLICY") or "aqua")
    options = dict(extra.get("aqua_policy_options") or {})
    for option in ("slice_iters", "max_wait_iters"):
        key = f"aqua_{option}"
        value = extra.get(key, os.environ.get(key.upper()))
        if value is not None and name == "aqua":
            options[option] = _integer(key, value)
    return get_policy(name, **options)


def _integer(key: str, value: object) -> int:
    """`value` as an int: an int, an integral float (JSON's 4.0) or a string of one (the environment).

    int() alone would take True as 1 and truncate 2.5 to 2.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str | int) and not isinstance(value, bool):
        try:
            return int(value)
        except ValueError:
            pass
    raise ValueError(f"{key} must be an integer, got {value!r}")


class AquaScheduler(Scheduler):
    """vLLM scheduler whose ordering, rotations and prefill cap come from a SchedulingPolicy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.policy != QueuePolicy.FCFS:
            raise ValueError("AquaScheduler needs vLLM's fcfs request queue (scheduling_policy='fcfs')")
        additional = self.vllm_config.additional_config
        additional = additional if isinstance(additional, dict) else {}
        self.aqua_policy = policy_from_config(additional)
        stats_dir = additional.get("aqua_stats_dir") or os.environ.get("AQUA_STATS_DIR")
        self._stats_file = StatsFile(Path(stats_dir) / "scheduler.json") if stats_dir else None
        self._iteration = 0
        self._next_seq = 0
        self._admission: dict[str, int] = {}
        self._high_water: dict[str, int] = {}  # tokens whose KV was ever computed, per request
        self.counters: dict[str, int] = {
            "steps": 0,
            "preemptions": 0,
            "rotations": 0,
            "prefill_tokens": 0,
            "recomputed_tokens": 0,
            "resumed_requests": 0,
            "held_back": 0,  # waiting requests held back by the policy's admission limit, per step
        }
        # Only policies that override admission_limit pay for the gate's views.
        self._gated = type(self.aqua_policy).admission_limit is not SchedulingPolicy.admission_limit
        self._dirty = False
        # Set for one step by _apply_prefill_cap: running prefill chunks served before a decode,
        # and how much of the prefill cap they may still take.
        self._ahead_of_decodes: frozenset[str] = frozenset()
        self._ahead_left = 0
        logger.info("AquaScheduler: policy %s", self.aqua_policy.name)

    # -- helpers ----------------------------------------------------------------------------------
    def _view(self, r: Request) -> VllmRequestView:
        seq = self._admission.get(r.request_id)
        if seq is None:
            seq = self._admission[r.request_id] = self._next_seq
            self._next_seq += 1
        return VllmRequestView(r, seq, self.kv_cache_manager, self.max_model_len)

    def _context(self) -> SchedContext:
        return SchedContext(
            now=time.time(),
            iteration=self._iteration,
            token_budget=self.max_num_scheduled_tokens,
            free_kv_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            total_kv_blocks=int(self.cache_config.num_gpu_blocks or 0),
            block_size=self.block_size,
            # The running slots vLLM admits into: max_num_active_seqs (at most max_num_seqs), less
            # those held by streaming sessions waiting for input (as its waiting loop counts them).
            max_running=max(0, self.max_num_active_reqs - self.num_waiting_for_streaming_input),
        )

    def _order_waiting(self, ctx: SchedContext) -> list[VllmRequestView]:
        if not self.waiting:
            return []
        kv = self.kv_cache_manager
        views = [VllmRequestView(r, -1, kv, self.max_model_len) for r in self.waiting]
        ordered = self.aqua_policy.order_waiting(views, ctx)
        queue = self.waiting
        assert isinstance(queue, FCFSRequestQueue)  # a deque
        queue.clear()
        queue.extend(v.request for v in ordered)
        return ordered

    def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
        self._admission.pop(request.request_id, None)
        self.counters["preemptions"] += 1
        self._dirty = True
        super()._preempt_request(request, timestamp, drop_stale_output)

    # -- the step ------------------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        ctx = self._context()
        policy = self.aqua_policy
        running = policy.order_running([self._view(r) for r in self.running], ctx)
        self.running = [v.request for v in running]
        waiting = self._order_waiting(ctx)
        # Rotate only for requests vLLM admits this step: a victim rotated for one it skips (its
        # grammar still compiling, the engine paused, ...) would be re-admitted in the same step
        # in its place (a recompute or a KV copy for nothing), and again every step until then.
        ready = [v for v in waiting if self._admissible_now(v.request)]
        rotations = policy.select_rotations(running, ready, ctx) if ready else []
        now = time.monotonic()
        for v in rotations:
            r = v.request
            if r.status != RequestStatus.RUNNING or r not in self.running:
                raise ValueError(f"policy {policy.name!r} rotated {r.request_id}, which is not running")
            if not self._request_blocks_can_be_freed(r):
                continue
            self.running.remove(r)
            self._preempt_request(r, now)
            self.counters["rotations"] += 1
        if rotations:
            ctx = self._context()  # the rotated requests' blocks are free now
            waiting = self._order_waiting(ctx)  # victims queue behind the requests they yield to
            still = {id(r) for r in self.running}
            running = [v for v in running if id(v.request) in still]
        held = self._hold_back(running, waiting, ctx) if self._gated and waiting else []
        budget = self.max_num_scheduled_tokens
        try:
            self._apply_prefill_cap(ctx)
            out = super().schedule(throttle_prefills)
        finally:
            self.max_num_scheduled_tokens = budget
            self._ahead_of_decodes = frozenset()
            for r in held:
                self.waiting.add_request(r)
        self._account(out)
        self._iteration += 1
        return out

    def _admissible_now(self, r: Request) -> bool:
        """Whether vLLM's `schedule()` may admit waiting request `r` this step (the checks of its
        waiting loop that do not depend on what else it schedules; read-only)."""
        if self._pause_state != PauseState.UNPAUSED:  # PAUSED_NEW admits KV-holding requests only
            return False
        status = r.status
        if status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
            so = r.structured_output_request
            return so is not None and so.grammar is not None and not isinstance(so.grammar, Exception)
        if status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            return r.request_id in self.finished_recving_kv_req_ids
        if status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            return False
        # Async scheduling: deliverable stale output still in flight (vLLM skips the request)
        return not (r.num_stale_output_tokens and not r.drop_stale_output)

    def _hold_back(
        self, running: list[VllmRequestView], waiting: list[VllmRequestView], ctx: SchedContext
    ) -> list[Request]:
        """Take the waiting requests past the policy's admission limit out of the queue."""
        limit = self.aqua_policy.admission_limit(running, waiting, ctx)
        if limit is None or limit >= len(waiting):
            return []
        limit = max(0, limit)
        queue = self.waiting
        assert isinstance(queue, FCFSRequestQueue)  # a deque, in the order of `waiting`
        queue.clear()
        queue.extend(v.request for v in waiting[:limit])
        held = [v.request for v in waiting[limit:]]
        self.counters["held_back"] += len(held)
        self._dirty = True
        return held

    def _apply_prefill_cap(self, ctx: SchedContext) -> None:
        """Limit this step's prefill tokens to the policy's cap; decodes keep all their tokens.

        The step's budget becomes the decodes' tokens plus the cap, which bounds every prefill
        served after the decodes (and every admission) through vLLM's own clamps. Running prefill
        chunks served before a decode share the cap in `_reserve_prefill_lookahead`.
        """
        policy = self.aqua_policy
        if type(policy).prefill_token_cap is SchedulingPolicy.prefill_token_cap:
            return  # the whole budget, as vLLM
        # A decode has at most one token without KV besides its draft tokens (async scheduling's
        # in-flight outputs counted as vLLM counts them), and its prompt computed; it gets them
        # all, no further than max_model_len, as in vLLM's loop over the running requests.
        room = self.max_model_len - self.num_sampled_tokens_per_step
        decode_tokens = decodes = 0
        ahead: list[str] = []  # prefill chunks served before the last decode seen so far
        prefills: list[str] = []
        for r in self.running:
            computed = r.num_computed_tokens
            pending = r.num_tokens + r.num_output_placeholders - computed
            if pending > 1 or computed < r.num_prompt_tokens:
                prefills.append(r.request_id)
                continue
            n = pending + len(r.spec_token_ids)
            decode_tokens += n if computed + n <= room else max(0, room - computed)
            decodes += 1
            if prefills:
                ahead.extend(prefills)
                prefills.clear()
        cap = max(0, policy.prefill_token_cap(ctx, decodes))
        if cap >= ctx.token_budget:
            return  # no cap: vLLM's own schedule
        self.max_num_scheduled_tokens = min(ctx.token_budget, decode_tokens + cap)
        self._ahead_of_decodes = frozenset(ahead)
        self._ahead_left = cap

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        """vLLM's last clamp of a request's tokens this step; also shares the prefill cap among the
        running prefill chunks served before a decode (set by `_apply_prefill_cap`)."""
        n = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        if request.request_id not in self._ahead_of_decodes:
            return n
        left = self._ahead_left
        # A chunk cut here would bypass vLLM's multimodal-item and Mamba-alignment clamps, applied
        # before this one: such a chunk keeps its size (the decodes behind it may then go short).
        if n > left and not (request.has_encoder_inputs or self.need_mamba_block_aligned_split):
            n = super()._reserve_prefill_lookahead(request, num_computed_tokens, left)
        self._ahead_left = max(0, left - n)
        return n

    def _account(self, out: SchedulerOutput) -> None:
        """Count prefill tokens and those recomputed (KV that had been computed before)."""
        c = self.counters
        c["steps"] += 1
        for nr in out.scheduled_new_reqs:
            if self.requests[nr.req_id].num_preemptions > 0:
                c["resumed_requests"] += 1
        c["resumed_requests"] += len(out.scheduled_cached_reqs.resumed_req_ids)
        requests, high_water = self.requests, self._high_water
        drafts = out.scheduled_spec_decode_tokens
        prefill = 0
        for req_id, n in out.num_scheduled_tokens.items():
            r = requests[req_id]
            # Speculative draft tokens are decode work, and their KV is kept only where accepted
            # (rejected positions are computed again with other tokens: no recompute). So neither
            # counts as prefill nor raises the high water.
            n -= len(drafts.get(req_id, ()))
            end = r.num_computed_tokens - len(drafts.get(req_id, ()))  # advanced by this step
            start = end - n
            if n > 1 or end <= r.num_prompt_tokens:
                prefill += n
            hw = high_water.get(req_id, 0)
            if hw <= start:  # the usual case: all of this step's tokens are new
                high_water[req_id] = end
                continue
            c["recomputed_tokens"] += min(hw, end) - start
            self._dirty = True
            high_water[req_id] = max(hw, end)
        c["prefill_tokens"] += prefill
        if out.finished_req_ids:
            # A request ended (or was aborted) since the last step: the connector has dropped its
            # offloaded copy, and the counters may not change again for a while (an idle engine).
            self._dirty = True
        if c["steps"] % 256 == 0:
            for req_id in [k for k in self._high_water if k not in self.requests]:
                del self._high_water[req_id]
            for req_id in [k for k in self._admission if k not in self.requests]:
                del self._admission[req_id]
        if self._dirty:
            self.publish_stats()
            self._dirty = False

    def shutdown(self) -> None:
        self.publish_stats()
        if self._stats_file is not None:
            self._stats_file.close()
        super().shutdown()

    def publish_stats(self) -> None:
        """Write the counters (and the connector's, if it is the Aqua connector) to scheduler.json."""
        if self._stats_file is not None:
            data: dict[str, Any] = dict(self.counters)
            planner = getattr(self.connector, "planner", None)
            if planner is not None:
                data["connector"] = dict(planner.counters)
            self._stats_file.publish(data)
