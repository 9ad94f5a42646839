"""vLLM schedulers without a model: built on the tiny Llama config, stepped by hand.

`schedule()` + `update_from_output()` with one sampled token per scheduled request is the engine
core's per-step work less the forward pass. Used by tests of the scheduler plug-in and by
benchmarks/sched_overhead.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tests.vllm_aqua.engines import BLOCK_SIZE, COMMON_ENGINE_ARGS


def make_scheduler(
    cls: type,
    *,
    max_num_seqs: int,
    num_blocks: int,
    max_model_len: int = 512,
    max_num_batched_tokens: int = 256,
    additional: dict[str, Any] | None = None,
    **engine_args: Any,
) -> Any:
    """A scheduler of class `cls` with a KV cache of `num_blocks` blocks of BLOCK_SIZE tokens.

    `engine_args` override COMMON_ENGINE_ARGS (e.g. `enable_prefix_caching=True`).
    """
    import torch
    from vllm import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from scripts.build_tiny_model import build_model

    args = EngineArgs(
        model=str(build_model()),
        dtype="float32",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        additional_config=additional or {},
        **{**COMMON_ENGINE_ARGS, **engine_args},
    )
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = num_blocks
    # Head count and size only size a block in bytes, which the scheduler never reads.
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64, dtype=torch.float32)
    kv_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return cls(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
    )


def make_speculative_scheduler(cls: type, *, drafts: int, num_blocks: int) -> Any:
    """`make_scheduler` (8 sequences, 128 batched tokens) with ngram speculation of `drafts` tokens."""
    return make_scheduler(
        cls,
        max_num_seqs=8,
        num_blocks=num_blocks,
        max_num_batched_tokens=128,
        speculative_config={"method": "ngram", "num_speculative_tokens": drafts, "prompt_lookup_max": 4},
    )


def propose_drafts(scheduler: Any, drafts: int) -> None:
    """The drafter proposes `drafts` tokens for every running decode (the model runner rejects them all)."""
    from vllm.v1.outputs import DraftTokenIds

    ids = [r.request_id for r in scheduler.running if not r.is_prefill_chunk]
    scheduler.update_draft_token_ids(DraftTokenIds(ids, [[5] * drafts for _ in ids]))


def make_request(
    req_id: str,
    prompt_tokens: int,
    max_tokens: int,
    arrival_time: float,
    extra_args: dict[str, Any] | None = None,
    prefix: Sequence[int] = (),
    block_hasher: Callable[[Any], list[Any]] | None = None,
) -> Any:
    """A vLLM request with a synthetic prompt, decoding `max_tokens` tokens (EOS ignored).

    The prompt starts with `prefix` (part of its `prompt_tokens`). A scheduler with prefix caching
    on reuses KV only for requests with a `block_hasher` (see `prefix_block_hasher`).
    """
    from vllm import SamplingParams
    from vllm.v1.request import Request

    if len(prefix) > prompt_tokens:
        raise ValueError(f"prefix of {len(prefix)} tokens is longer than {prompt_tokens=}")
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, extra_args=extra_args)
    own = [(len(req_id) + j) % 100 + 1 for j in range(prompt_tokens - len(prefix))]
    return Request(
        req_id, [*prefix, *own], params, None, arrival_time=arrival_time, block_hasher=block_hasher
    )


def prefix_block_hasher() -> Callable[[Any], list[Any]]:
    """The block hasher the engine core gives requests when prefix caching is on (BLOCK_SIZE)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(BLOCK_SIZE, hash_fn)


def step(scheduler: Any, produced: dict[str, int] | None = None) -> Any:
    """One engine step without a model: schedule, then sample token 7 for every scheduled request
    but the non-final prefill chunks.

    Returns the SchedulerOutput; `produced` (request id -> tokens) counts the tokens the engine
    core emitted to clients in this step.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    # Like the model runner, sample nothing for a request whose prompt is not yet all computed.
    sampled = [[] if scheduler.requests[r].is_prefill_chunk else [7] for r in ids]
    result = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled
    )
    emitted = scheduler.update_from_output(out, result)
    if produced is not None:
        for outputs in emitted.values():
            for o in outputs.outputs:
                produced[o.request_id] = produced.get(o.request_id, 0) + len(o.new_token_ids)
    return out
