"""Scheduler side of the Aqua connector: decide which KV to offload and what to restore.

Bookkeeping (all keyed by request id):
  _live:       for every request scheduled in the last step it ran, its block ids and the number of
               tokens whose KV those blocks hold once that step has run (computed + scheduled).
               A request found here after vLLM preempted it is turned into a SaveJob. Kept up to
               date from the scheduler output's own deltas (block ids of new and resumed requests,
               appended block ids of running ones), so a step without preemptions costs one dict
               update per scheduled request and copies no block table.
  _offloaded:  requests with a saved buffer and its token count. Optimistic: the worker reports
               saves it could not keep (`lost`), and a load that finds nothing reports its
               blocks as invalid, so vLLM recomputes them. Never wrong tokens, at worst recompute.
  _unrestorable: requests vLLM never loads KV for (`skip_reading_prefix_cache`, set for prompt
               logprobs): not saved on preemption, as nothing would read the copy.

Preemption is seen at two moments: in `get_num_new_matched_tokens` when a preempted request is
re-admitted in the same step (vLLM asks only for requests with no computed tokens), and in
`build_connector_meta` through `scheduler_output.preempted_req_ids`. The worker runs the step's
saves (handle_preemptions) before its loads (start_load_kv), both before the forward pass that
could overwrite freed blocks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from serving.vllm_ext.offload_meta import AquaConnectorMetadata, AquaWorkerMetadata, LoadJob, SaveJob

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


class _Extent:
    """A running request's block ids (appended in place) and the tokens their KV holds."""

    __slots__ = ("block_ids", "num_tokens")

    def __init__(self, block_ids: list[int], num_tokens: int) -> None:
        self.block_ids = block_ids
        self.num_tokens = num_tokens


class OffloadPlanner:
    """Plans saves on preemption and loads on re-admission (one KV cache group)."""

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"{block_size=} must be positive")
        self.block_size = block_size
        self._live: dict[str, _Extent] = {}
        self._offloaded: dict[str, int] = {}
        self._local_hit: dict[str, int] = {}
        self._unrestorable: set[str] = set()
        self._meta = AquaConnectorMetadata()
        self.counters: dict[str, int] = {
            "saves_planned": 0,
            "tokens_offloaded": 0,
            "loads_planned": 0,
            "tokens_matched": 0,
            "offloads_lost": 0,
            "offloads_dropped": 0,
        }

    # -- preemption -------------------------------------------------------------------------
    def _capture(self, req_id: str) -> None:
        live = self._live.pop(req_id, None)
        if live is None or req_id in self._unrestorable:
            return
        block_ids, num_tokens = live.block_ids, live.num_tokens
        n_blocks = math.ceil(num_tokens / self.block_size)
        if num_tokens <= 0 or n_blocks > len(block_ids):
            return
        self._meta.saves.append(SaveJob(req_id, list(block_ids[:n_blocks]), num_tokens))
        self._offloaded[req_id] = num_tokens
        self.counters["saves_planned"] += 1
        self.counters["tokens_offloaded"] += num_tokens

    # -- vLLM hooks ---------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens restorable beyond `num_computed_tokens` (loaded synchronously)."""
        req_id = request.request_id
        if request.skip_reading_prefix_cache:  # vLLM ignores what we offer: never copy it out
            self._unrestorable.add(req_id)
            self._live.pop(req_id, None)
            return 0, False
        self._capture(req_id)  # preempted since the last build_connector_meta
        saved = self._offloaded.get(req_id, 0)
        # The last token is always computed by the engine: it produces the next logits.
        usable = min(saved, request.num_tokens - 1)
        if usable <= num_computed_tokens:
            return 0, False
        self._local_hit[req_id] = num_computed_tokens
        return usable - num_computed_tokens, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external: int) -> None:
        """Plan the load of `num_external` tokens into the blocks just allocated (none: the
        request's buffer, if any, is freed)."""
        req_id = request.request_id
        local = self._local_hit.pop(req_id, 0)
        saved = self._offloaded.pop(req_id, 0)
        if num_external <= 0:
            # Admitted without a load (vLLM declined it: a request with prompt logprobs skips every
            # cache; or the local prefix cache covers it): the buffer is never read (a later
            # preemption saves anew). Free it now, not when the request finishes.
            if saved:
                self._drop(req_id)
            return
        if saved < local + num_external:
            raise RuntimeError(f"{req_id}: load of {local}+{num_external} tokens but {saved} saved")
        block_ids = blocks.get_block_ids()[0]
        first = local // self.block_size
        last = math.ceil((local + num_external) / self.block_size)
        self._meta.loads.append(
            LoadJob(req_id, list(block_ids[first:last]), first, math.ceil(saved / self.block_size))
        )
        self.counters["loads_planned"] += 1
        self.counters["tokens_matched"] += num_external

    def build_connector_meta(self, so: SchedulerOutput) -> AquaConnectorMetadata:
        """This step's jobs; also records the extent of every scheduled request's KV."""
        if so.preempted_req_ids:
            for req_id in sorted(so.preempted_req_ids):
                self._capture(req_id)
        live = self._live
        n_sched = so.num_scheduled_tokens
        for nr in so.scheduled_new_reqs:
            live[nr.req_id] = _Extent(list(nr.block_ids[0]), nr.num_computed_tokens + n_sched[nr.req_id])
        cached = so.scheduled_cached_reqs
        resumed = cached.resumed_req_ids
        for req_id, new_ids, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
        ):
            ext: _Extent | None
            if req_id in resumed:  # new_ids replace the block table
                ext = _Extent(list(new_ids[0]), 0) if new_ids is not None else None
                if ext is not None:
                    live[req_id] = ext
            else:  # new_ids (if any) are appended
                ext = live.get(req_id)  # None: table not seen from its start, cannot be saved
                if ext is not None and new_ids is not None:
                    ext.block_ids.extend(new_ids[0])
            if ext is None:
                live.pop(req_id, None)
            else:
                ext.num_tokens = computed + n_sched[req_id]
        meta, self._meta = self._meta, AquaConnectorMetadata()
        return meta

    def update_connector_output(self, worker_meta: Any, invalid_block_ids: Collection[int] = ()) -> None:
        """Forget offloads the worker could not keep; their requests will recompute.

        `invalid_block_ids`: blocks a load could not fill this step. vLLM truncates each running
        request holding one to the tokens before its first such block (they are recomputed), and
        so does the request's extent here: were it preempted before it runs again, the blocks it
        holds beyond that hold no valid KV, and saving them would restore garbage as computed.
        """
        if invalid_block_ids:
            invalid = set(invalid_block_ids)
            for ext in self._live.values():
                first = next((i for i, b in enumerate(ext.block_ids) if b in invalid), None)
                if first is not None:
                    ext.num_tokens = min(ext.num_tokens, first * self.block_size)
        if not isinstance(worker_meta, AquaWorkerMetadata):
            return
        for req_id in sorted(worker_meta.lost):
            if self._offloaded.pop(req_id, None) is not None:
                self.counters["offloads_lost"] += 1

    def request_finished(self, req_id: str) -> None:
        """Drop all state of a finished (or aborted) request and free its offloaded buffer."""
        self._live.pop(req_id, None)
        self._local_hit.pop(req_id, None)
        self._unrestorable.discard(req_id)
        if self._offloaded.pop(req_id, None) is not None:
            self._drop(req_id)

    def _drop(self, req_id: str) -> None:
        """Have the worker free `req_id`'s buffer in the next step (no longer in `_offloaded`)."""
        self._meta.drops.append(req_id)
        self.counters["offloads_dropped"] += 1
