"""Simulator speed: an 8-GPU server at 50 requests/s for one simulated hour.

One llama-3-8b engine per H100 (cost model preset `get_preset("llama-3-8b", "h100")`, KV capacity
from `kv_capacity_tokens` at 0.9 memory utilisation, vLLM defaults otherwise), FCFS, a Poisson
workload with ShareGPT-like lengths (serving/workload/datasets.py) routed round-robin over the
eight engines. Target: `speedup_over_real_time` = simulated seconds / wall seconds >= 20.

Baseline, measured in the same run: the same simulation stepping every iteration (fast forward
off). The two must produce bit-identical token times; `identical_to_stepped` records the check.

Usage: python benchmarks/sim_speed.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import sys
import time
from array import array
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as `python benchmarks/...`

from benchmarks.bench_io import default_out, non_negative_int, out_file
from serving.atomic_file import write_json_atomic
from serving.costmodel.presets import get_preset, kv_capacity_tokens
from serving.metrics.summary import summarize
from serving.sim.cluster import ClusterResult, ClusterSim, EngineSpec
from serving.sim.config import EngineConfig
from serving.workload.factory import make_workload

MODEL, GPU, GPUS, RATE = "llama-3-8b", "h100", 8, 50.0


def build_cluster(fast_forward: bool) -> ClusterSim:
    cost = get_preset(MODEL, GPU)
    config = EngineConfig(
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        block_size=16,
        num_kv_blocks=kv_capacity_tokens(MODEL, GPU) // 16,
        fast_forward=fast_forward,
    )
    engines = [EngineSpec(f"s0/g{g}", "s0", (g,), MODEL, cost, replace(config), gpu=GPU) for g in range(GPUS)]
    return ClusterSim({"s0": GPUS}, engines)


def digest(result: ClusterResult) -> str:
    h = hashlib.sha256()
    for rec in result.all_records():
        h.update(array("d", rec.token_times).tobytes())
    return h.hexdigest()


def timed_run(cluster: ClusterSim, requests: list) -> tuple[ClusterResult, float, float]:
    """Run the cluster; returns (result, wall seconds, CPU seconds of this process)."""
    gc.collect()
    gc.disable()  # millions of long-lived token-time floats: the cyclic GC only costs time here
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        result = cluster.run(requests)
        return result, time.perf_counter() - t0, time.process_time() - c0
    finally:
        gc.enable()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 simulated minutes instead of 60")
    ap.add_argument("--out", type=out_file, default=default_out("sim_speed"))
    ap.add_argument("--seed", type=non_negative_int, default=0)
    args = ap.parse_args()
    duration = 300.0 if args.quick else 3600.0

    t0 = time.perf_counter()
    requests = make_workload("poisson", RATE, duration, "sharegpt", args.seed)
    gen_s = time.perf_counter() - t0

    result, wall, cpu = timed_run(build_cluster(True), requests)
    sim_s = max(s.end_time for s in result.stats.values())
    iterations = sum(s.iterations for s in result.stats.values())
    jumped = sum(s.fast_forwarded_iterations for s in result.stats.values())
    records = result.all_records()
    summary = summarize(records, sim_s)
    fast_digest = digest(result)
    del result, records
    gc.collect()

    base, base_wall, base_cpu = timed_run(build_cluster(False), requests)
    identical = digest(base) == fast_digest
    del base
    gc.collect()

    out = {
        "speedup_over_real_time": sim_s / wall,
        "simulated_seconds": sim_s,
        "wall_seconds": wall,
        # The machine is shared: CPU seconds show how much of the wall time was this process's.
        "cpu_seconds": cpu,
        "speedup_over_cpu_time": sim_s / cpu,
        "load_average_1m_at_end": os.getloadavg()[0],
        "requests": len(requests),
        "iterations": iterations,
        "fast_forwarded_iterations": jumped,
        "tokens": int(summary["throughput_tokens_per_s"] * sim_s + 0.5),
        "target_speedup": 20.0,
        "baseline_stepped_wall_seconds": base_wall,
        "baseline_stepped_cpu_seconds": base_cpu,
        "baseline_stepped_speedup_over_real_time": sim_s / base_wall,
        "fast_forward_vs_stepped": base_wall / wall,
        "identical_to_stepped": identical,
        "workload_generation_seconds": gen_s,
        "setup": {
            "model": MODEL,
            "gpu": GPU,
            "gpus": GPUS,
            "rate": RATE,
            "duration_s": duration,
            "dataset": "sharegpt",
            "policy": "fcfs",
            "seed": args.seed,
            "quick": args.quick,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
        },
        "ttft_p50": summary["ttft_p50"],
        "ttft_p99": summary["ttft_p99"],
        "tbt_p50": summary["tbt_p50"],
        "tbt_p99": summary["tbt_p99"],
        "throughput_tokens_per_s": summary["throughput_tokens_per_s"],
    }
    write_json_atomic(args.out, out)
    print(
        f"{len(requests)} requests, {iterations} iterations ({jumped} fast-forwarded), "
        f"{sim_s:.0f} simulated s in {wall:.1f} wall s ({cpu:.1f} CPU s)\n"
        f"speedup over real time: {sim_s / wall:.1f}x (target >= 20x)\n"
        f"baseline (stepping every iteration): {base_wall:.1f} s, {sim_s / base_wall:.1f}x real time; "
        f"fast forward is {base_wall / wall:.2f}x faster, identical results: {identical}\n"
        f"wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
