"""Scheduler overhead: what AquaScheduler (policy `aqua`) adds to vLLM's own scheduler per step.

No model runs: vLLM 0.32's `Scheduler` and `AquaScheduler` are built on the tiny Llama config
with a KV cache config of their own, given `running` requests, and driven through
`schedule()` + `update_from_output()` with one sampled token per request per step: the engine
core's per-step work, less the forward pass. Every request decodes in every measured step. That is
the steady state of the aqua_burst benchmark's long requests, where the engine-core timing showed
`schedule()` at 106-111 us for ours against 77-86 us for vLLM's (benchmarks/aqua_burst.py, README).
The two schedulers alternate, each with a fresh instance per repetition; per repetition the
median step is kept, and the report gives the median over repetitions.

    python benchmarks/sched_overhead.py [--quick] [--out benchmarks/results/sched_overhead.json]

JSON: per number of running requests, `default_us` and `aqua_us` (microseconds per step),
`overhead_us` (their difference) and `overhead_per_request_us`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.vllm_aqua.engines import BLOCK_SIZE  # noqa: E402  (the engine tests' and aqua_burst's)

MAX_MODEL_LEN = 512
PROMPT_TOKENS = 30
WARMUP_STEPS = 20


def make_scheduler(cls: type, running: int) -> Any:
    """A scheduler of class `cls` for up to `running` requests, with room for all their KV."""
    import torch
    from vllm import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from scripts.build_tiny_model import build_model

    args = EngineArgs(
        model=str(build_model()),
        dtype="float32",
        block_size=BLOCK_SIZE,
        enable_prefix_caching=False,
        max_num_seqs=running,
        max_num_batched_tokens=max(256, running),
        max_model_len=MAX_MODEL_LEN,
        async_scheduling=False,
        enforce_eager=True,
    )
    config = args.create_engine_config()
    num_blocks = running * MAX_MODEL_LEN // BLOCK_SIZE + 1
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


def step_times(scheduler: Any, running: int, steps: int) -> list[float]:
    """Seconds per schedule() + update_from_output() over `steps` steps after the warm-up."""
    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=MAX_MODEL_LEN, ignore_eos=True, temperature=0.0)
    now = time.time()
    for i in range(running):
        prompt = [(i + j) % 100 + 1 for j in range(PROMPT_TOKENS)]
        scheduler.add_request(Request(f"req-{i}", prompt, params, None, arrival_time=now + i * 1e-3))
    times = []
    for _ in range(WARMUP_STEPS + steps):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        result = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=[[7]] * len(ids)
        )
        scheduler.update_from_output(out, result)
        times.append(time.perf_counter() - t0)
    return times[WARMUP_STEPS:]


def measure(running: int, steps: int, reps: int) -> dict[str, Any]:
    from vllm.v1.core.sched.scheduler import Scheduler

    from serving.vllm_ext.scheduler import AquaScheduler

    if PROMPT_TOKENS + WARMUP_STEPS + steps > MAX_MODEL_LEN:
        raise ValueError(f"{steps=} would run requests past max_model_len {MAX_MODEL_LEN}")
    medians: dict[str, list[float]] = {"default": [], "aqua": []}
    for _ in range(reps):
        for name, cls in (("default", Scheduler), ("aqua", AquaScheduler)):
            times = step_times(make_scheduler(cls, running), running, steps)
            medians[name].append(statistics.median(times) * 1e6)
    default_us = statistics.median(medians["default"])
    aqua_us = statistics.median(medians["aqua"])
    return {
        "running": running,
        "default_us": default_us,
        "aqua_us": aqua_us,
        "overhead_us": aqua_us - default_us,
        "overhead_per_request_us": (aqua_us - default_us) / running,
        "aqua_over_default": aqua_us / default_us,
        "rep_medians_us": medians,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a short run (seconds)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sched_overhead.json")
    args = ap.parse_args()
    steps, reps = (100, 2) if args.quick else (400, 7)
    t0 = time.perf_counter()
    configs = [measure(running, steps, reps) for running in (8, 64)]
    result = {
        "configs": configs,
        "steps": steps,
        "reps": reps,
        "quick": args.quick,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "wall_s": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    for c in configs:
        print(
            f"{c['running']:3d} running: vLLM {c['default_us']:.1f} us/step, aqua {c['aqua_us']:.1f} us/step "
            f"(+{c['overhead_us']:.1f} us, {c['overhead_per_request_us']:.2f} us per request)"
        )
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
