"""A vLLM `Request` seen through the policy's `SchedRequest` protocol (read-only).

Two per-request hints travel in `SamplingParams.extra_args`, which vLLM's OpenAI server fills from
a request's `vllm_xargs` (e.g. `"vllm_xargs": {"predicted_output_tokens": 120, "slo_class": "chat"}`):

    predicted_output_tokens   a positive integer: the response length a predictor expects
                              (EcoServe reads one above `max_tokens`, or above the room
                              max_model_len leaves after the prompt, as that many tokens)
    slo_class                 a non-empty string: the key of the request's SLO in the policy's
                              `class_slos`

A missing or malformed hint reads as None (no prediction, the default SLO): the engine has already
accepted the request, so the scheduler cannot refuse it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import Request

    from serving.policies.base import SchedRequest

PREDICTION_KEY = "predicted_output_tokens"
SLO_CLASS_KEY = "slo_class"


def _extra(request: Request) -> dict[str, Any] | None:
    params = request.sampling_params
    return params.extra_args if params is not None else None


class VllmRequestView:
    """Adapter: exposes what a `SchedulingPolicy` may read about a vLLM request.

    Args:
        request: The engine's request object (read, never modified).
        admission_seq: Sequence number of its latest admission to the running set (kept by the
            scheduler, since vLLM does not number admissions).
        kv_cache_manager: The scheduler's KV cache manager, whose block tables tell what a
            preemption frees; None: the policy estimates it from the computed tokens.
        max_model_len: The engine's context length, which stops a response before `max_tokens`
            when the prompt leaves less room; None: only `max_tokens` caps it.
    """

    __slots__ = ("_hits", "_kv", "_max_model_len", "_r", "admission_seq")

    def __init__(
        self,
        request: Request,
        admission_seq: int,
        kv_cache_manager: KVCacheManager | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self._r = request
        self.admission_seq = admission_seq
        self._kv = kv_cache_manager
        self._max_model_len = max_model_len
        self._hits: list[KVCacheBlock] | None = None  # the prefix cache's blocks for our prompt

    @property
    def request(self) -> Request:
        return self._r

    @property
    def req_id(self) -> str:
        return self._r.request_id

    @property
    def arrival_time(self) -> float:
        return float(self._r.arrival_time)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._r.num_prompt_tokens)

    @property
    def num_computed_prompt_tokens(self) -> int:
        return min(int(self._r.num_computed_tokens), int(self._r.num_prompt_tokens))

    @property
    def num_computed_tokens(self) -> int:
        return int(self._r.num_computed_tokens)

    @property
    def num_output_tokens(self) -> int:
        return int(self._r.num_output_tokens)

    @property
    def num_draft_tokens(self) -> int:
        """Speculative draft tokens vLLM schedules with this request's next decode (their KV too)."""
        return len(self._r.spec_token_ids)

    @property
    def num_preemptions(self) -> int:
        return int(self._r.num_preemptions)

    @property
    def predicted_output_tokens(self) -> int | None:
        extra = _extra(self._r)
        value = extra.get(PREDICTION_KEY) if extra else None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        return None

    @property
    def max_output_tokens(self) -> int:
        """The request's `max_tokens`, or the room `max_model_len` leaves after the prompt if less
        (vLLM stops the request there too): EcoServe reads a larger prediction as this many tokens
        and reserves no more, so that a client's absurd hint cannot reserve KV the request will
        never use (and hold back every other request while it runs)."""
        cap = int(self._r.max_tokens)
        if self._max_model_len is not None:
            cap = min(cap, max(0, self._max_model_len - int(self._r.num_prompt_tokens)))
        return cap

    @property
    def slo_class(self) -> str | None:
        extra = _extra(self._r)
        value = extra.get(SLO_CLASS_KEY) if extra else None
        return value if isinstance(value, str) and value else None

    def kv_blocks_freed_by_preemption(self, preempted: Sequence[SchedRequest]) -> int | None:
        """Blocks of this request that vLLM's `free` returns to the pool after `preempted`'s.

        A block goes back to the free pool when its reference count drops to 0: with prefix
        caching, blocks shared with other requests (a common system prompt) stay allocated while
        any of them keeps running. Null blocks (skipped by a sliding window) and blocks of
        another pool free nothing here. Costs a pass over the blocks of this request and of
        `preempted`, so the policy calls it only for the victims it plans.
        """
        kv = self._kv
        if kv is None:
            return None
        dropped = _dropped_refs(kv, preempted)
        return sum(1 for b in _own_blocks(kv, self._r.request_id) if b.ref_cnt - dropped[b.block_id] == 1)

    def kv_blocks_taken_by_admission(self, preempted: Sequence[SchedRequest]) -> int | None:
        """Blocks vLLM's admission of this waiting request takes from the free pool after `preempted`.

        vLLM allocates its whole sequence (prompt and output tokens) less its prefix-cache hit
        (`get_computed_blocks`), but a hit block no request references is in the free pool and
        admission takes it out (`touch`): only hits on blocks that requests other than `preempted`
        keep save blocks. The hit is looked up as vLLM does, through the coordinator's
        `find_longest_cache_hit` (a read of the block-hash table; `get_computed_blocks` may emit
        KV-cache events, and the prefix-cache stats are recorded by the scheduler, not here), once
        per view. None (the policy's estimate) for a request that skips the prefix cache, already
        holds KV, or for KV caches other than a single full-attention group (sliding windows,
        hybrid models), whose hits vLLM trims further.
        """
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        kv = self._kv
        r = self._r
        if kv is None or r.num_computed_tokens > 0 or not kv.prefix_cache_lookup_enabled(r):
            return None
        groups = kv.kv_cache_config.kv_cache_groups
        if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, FullAttentionSpec):
            return None
        block_size = groups[0].kv_cache_spec.block_size
        hits = self._hits
        if hits is None:
            # As get_computed_blocks: the last token is always computed, for its logits.
            blocks, hit_tokens, _ = kv.coordinator.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
            hits = self._hits = blocks[0][: hit_tokens // block_size]
        dropped = _dropped_refs(kv, preempted)
        kept = sum(1 for b in hits if b.ref_cnt - dropped[b.block_id] > 0)
        return -(-r.num_tokens // block_size) - kept


def _own_blocks(kv: KVCacheManager, req_id: str) -> list[KVCacheBlock]:
    """The blocks of `req_id` that freeing it may return to `kv`'s pool (not null ones, not those
    of another pool: vLLM's `free_blocks` hands those to their own pool)."""
    ours = (kv.block_pool, None)
    return [b for g in kv.get_blocks(req_id).blocks for b in g if b.pool in ours and not b.is_null]


def _dropped_refs(kv: KVCacheManager, preempted: Sequence[SchedRequest]) -> Counter[int]:
    """Block id -> references that preempting `preempted` drops."""
    dropped: Counter[int] = Counter()
    for p in preempted:
        dropped.update(b.block_id for b in _own_blocks(kv, str(p.req_id)))
    return dropped
