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
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_io import default_out, out_file  # noqa: E402
from serving.atomic_file import write_json_atomic  # noqa: E402
from tests.vllm_aqua import bare_scheduler  # noqa: E402
from tests.vllm_aqua.engines import BLOCK_SIZE  # noqa: E402  (the engine tests' and aqua_burst's)

MAX_MODEL_LEN = 512
PROMPT_TOKENS = 30
WARMUP_STEPS = 20


def make_scheduler(cls: type, running: int) -> Any:
    """A scheduler of class `cls` for up to `running` requests, with room for all their KV."""
    num_blocks = running * MAX_MODEL_LEN // BLOCK_SIZE + 1
    return bare_scheduler.make_scheduler(
        cls,
        max_num_seqs=running,
        num_blocks=num_blocks,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=max(256, running),
    )


def step_times(scheduler: Any, running: int, steps: int) -> list[float]:
    """Seconds per schedule() + update_from_output() over `steps` steps after the warm-up."""
    now = time.time()
    for i in range(running):
        req = bare_scheduler.make_request(f"req-{i}", PROMPT_TOKENS, MAX_MODEL_LEN, now + i * 1e-3)
        scheduler.add_request(req)
    times = []
    for _ in range(WARMUP_STEPS + steps):
        t0 = time.perf_counter()
        bare_scheduler.step(scheduler)
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
    ap.add_argument("--out", type=out_file, default=default_out("sched_overhead"))
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
    write_json_atomic(args.out, result, sort_keys=True)
    for c in configs:
        print(
            f"{c['running']:3d} running: vLLM {c['default_us']:.1f} us/step, aqua {c['aqua_us']:.1f} us/step "
            f"(+{c['overhead_us']:.1f} us, {c['overhead_per_request_us']:.2f} us per request)"
        )
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
