"""vLLM schedulers without a model: built on the tiny Llama config, stepped by hand.

`schedule()` + `update_from_output()` with one sampled token per scheduled request is the engine
core's per-step work less the forward pass. Used by tests of the scheduler plug-in and by
benchmarks/sched_overhead.py.
"""

from __future__ import annotations

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
) -> Any:
    """A scheduler of class `cls` with a KV cache of `num_blocks` blocks of BLOCK_SIZE tokens."""
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
        **COMMON_ENGINE_ARGS,
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


def make_request(
    req_id: str,
    prompt_tokens: int,
    max_tokens: int,
    arrival_time: float,
    extra_args: dict[str, Any] | None = None,
) -> Any:
    """A vLLM request with a synthetic prompt, decoding `max_tokens` tokens (EOS ignored)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, extra_args=extra_args)
    prompt = [(len(req_id) + j) % 100 + 1 for j in range(prompt_tokens)]
    return Request(req_id, prompt, params, None, arrival_time=arrival_time)


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
