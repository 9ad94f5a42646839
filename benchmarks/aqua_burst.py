"""Aqua burst benchmark on the real vLLM CPU engine (tiny model).

Long-output requests fill the engine (every running slot and most of the KV cache); then a burst of
short requests arrives. Run twice on one engine config: vLLM's default scheduler (FCFS, recompute
preemption) and ours (AquaScheduler with the `aqua` policy + AquaConnector offloading to DRAM).

    python benchmarks/aqua_burst.py [--quick] [--out benchmarks/results/aqua_burst.json] [--html PATH]

JSON keys: per run p50/p99 TTFT and TBT (seconds) and throughput (generated tokens/s over the
makespan); `p99_ttft_ratio` (default/ours, target >= 25), `throughput_ratio` (ours/default, target
>= 0.95), `resume_cost_ratio` (recomputing a resumed request's KV / restoring it, target >= 5) and
`copy_bandwidth_fraction` (the aggregated gather+copy's bandwidth over a plain memcpy of the same
bytes, target >= 0.8). Three more engines attribute the result (`attribution`): `sched_only`
(AquaScheduler, recompute preemption, no connector), `default_with_connector` (vLLM's scheduler
with the Aqua connector loaded) and `default_with_noop_connector` (vLLM's scheduler with a
connector that does nothing, benchmarks/noop_connector.py: what vLLM's per-step connector hooks
cost by themselves); the full run starts them, --quick does not. All engines stay up and the
workload alternates between them. After each round, default and ours also get the same burst
of shorts with nothing else running (`idle_burst`). On the idle engine ours' burst p99 is what
vLLM's front end and one prefill step per wave of `max_num_seqs` shorts allow: no long request is
in the way. (The idle default is slower: its second wave waits for the first to finish.) So
`p99_ttft_ratio` cannot get far above `p99_ttft_ratio_ceiling` (the default's burst p99 over ours'
idle one), and `ours_burst_p99_over_idle` says what the long requests still cost ours.

Changes to the setup, with the measurements behind them (also in the JSON under `setup_notes`):
  * The burst arrives when a long request has streamed `burst_after_tokens` (half of its output)
    tokens, not after a fixed 2 s. With a fixed time the scenario depended on the machine's speed:
    on a quiet machine (TBT 7 ms) the long requests were nearly done at 2 s and the default
    scheduler's burst p99 TTFT was 0.49 s; one round later under load (TBT 9 ms) it was 1.5 s.
    Half-way is the expected position of a burst that arrives at a random time during the long
    requests; it is also about where the earlier fixed 2 s landed under the load it was run at.
  * The long requests generate 480 tokens (`--long-tokens`; 320 until 2026-12-07), so the burst
    meets 240 remaining decode steps instead of 160. The default scheduler's burst waits for them
    (its burst p99 TTFT grows with the remaining output) while ours' does not, so p99_ttft_ratio
    grows with the output length. Same code, same machine, one after the other (2026-12-07):
    34.3 at 480 tokens (paired-round median 34.2), 24.8 at 320 (median 20.8;
    benchmarks/results/aqua_burst_long320.json). 480 output tokens is still a modest chat answer.
  * Every engine runs one unmeasured round of the workload first (see SETUP_NOTES).
  * Engines take turns 1.5 s apart, in an order that rotates each round (see SETUP_NOTES).
  * Every engine runs with vLLM's no-connector OpenMP core reservation
    (VLLM_CPU_NUM_OF_RESERVED_CPU=1, see serving/vllm_ext/cpu_binding.py). vLLM's default engine
    gets that value anyway; engines with a KV connector would otherwise lose the engine core's
    reserved core on this 2-core machine, which alone made them 5-7x slower per step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.aqua_burst_notes import SETUP_NOTES  # noqa: E402
from benchmarks.aqua_copy import copy_bandwidth  # noqa: E402
from benchmarks.bench_io import bounded_int, chart_file, default_out, out_file  # noqa: E402
from serving.aqua.offload.stats import read_json  # noqa: E402
from serving.atomic_file import write_json_atomic, write_text_atomic  # noqa: E402
from serving.vllm_ext.cpu_binding import RESERVED_CPUS_ENV  # noqa: E402
from tests.vllm_aqua import engines  # noqa: E402

TARGETS = {
    "p99_ttft_ratio": 25.0,
    "throughput_ratio": 0.95,
    "resume_cost_ratio": 5.0,
    "copy_bandwidth_fraction": 0.8,
}


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


async def _one(
    llm: Any,
    prompt: str,
    max_tokens: int,
    rid: str,
    start: float,
    progress: tuple[int, asyncio.Event] | None = None,
    log: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Stream one request; with `progress` = (n, event), set the event once n tokens arrived.
    With `log`, append the request's submit and first-token times in wall-clock seconds (the
    clock of benchmarks/steptrace_sched.py's engine-side trace)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    sp = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    wall0, t0 = time.time(), time.perf_counter()
    stamps: list[float] = []
    n_prompt = 0
    async for out in llm.generate(prompt, sp, request_id=rid):
        now = time.perf_counter()
        stamps.extend([now] * len(out.outputs[0].token_ids))
        if progress is not None and len(stamps) >= progress[0]:
            progress[1].set()
        n_prompt = max(n_prompt, len(out.prompt_token_ids or []))
    if log is not None and stamps:
        log.append({"id": rid, "submit": wall0, "first": wall0 + stamps[0] - t0})
    return {"id": rid, "submit": t0 - start, "stamps": [s - start for s in stamps], "prompt_tokens": n_prompt}


def _shorts(cfg: dict[str, Any]) -> list[str]:
    """The burst's prompts (the same in every round and in the idle burst)."""
    return engines.make_prompts(cfg["n_short"], seed=8, min_words=6, max_words=20)


def long_prompts(cfg: dict[str, Any]) -> list[str]:
    """The long requests' prompts (the same in every round)."""
    return engines.make_prompts(cfg["n_long"], seed=7, min_words=20, max_words=40)


async def _workload(
    llm: Any, cfg: dict[str, Any], tag: str, log: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    longs = long_prompts(cfg)
    shorts = _shorts(cfg)
    # Warm up (first forward passes allocate and JIT).
    await _one(llm, "warm up", 4, f"warm-{tag}", time.perf_counter())
    start = time.perf_counter()
    halfway = asyncio.Event()
    progress = (cfg["burst_after_tokens"], halfway)
    tasks = [
        asyncio.create_task(_one(llm, p, cfg["long_tokens"], f"long-{tag}-{i}", start, progress, log))
        for i, p in enumerate(longs)
    ]
    await halfway.wait()
    burst_at = time.perf_counter() - start
    tasks += [
        asyncio.create_task(_one(llm, p, cfg["short_tokens"], f"short-{tag}-{i}", start, log=log))
        for i, p in enumerate(shorts)
    ]
    results = await asyncio.gather(*tasks)
    end = max(r["stamps"][-1] for r in results)
    burst = [r for r in results if r["id"].startswith("short")]
    ttft = [r["stamps"][0] - r["submit"] for r in burst]
    tbt = [b - a for r in results for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    tokens = sum(len(r["stamps"]) for r in results)
    return {
        "burst_ttft_p50_s": pct(ttft, 50),
        "burst_ttft_p99_s": pct(ttft, 99),
        "tbt_p50_s": pct(tbt, 50),
        "tbt_p99_s": pct(tbt, 99),
        "throughput_tok_s": tokens / end,
        "makespan_s": end,
        "generated_tokens": tokens,
        "ttft_all_s": sorted(ttft),
        "burst_at_s": burst_at,
    }


async def _idle_burst(
    llm: Any, cfg: dict[str, Any], tag: str, log: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """The workload's burst of shorts sent to an idle engine: its TTFT with no long request in the
    way (the scheduler still decides how the waves of `max_num_seqs` shorts share the slots)."""
    start = time.perf_counter()
    results = await asyncio.gather(
        *(
            _one(llm, p, cfg["short_tokens"], f"idle-{tag}-{i}", start, log=log)
            for i, p in enumerate(_shorts(cfg))
        )
    )
    ttft = [r["stamps"][0] - r["submit"] for r in results]
    return {"ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99)}


IDLE_BURST_ENGINES = ("default", "ours")


# Extra engines that attribute the difference: the scheduler alone (recompute preemption),
# vLLM's scheduler with the connector loaded (no rotations, so almost no offloads), and vLLM's
# scheduler with a connector that does nothing (the cost of vLLM's connector hooks alone).
VARIANTS = ("default", "ours", "sched_only", "default_with_connector", "default_with_noop_connector")
NOOP_CONNECTOR = {
    "kv_connector": "NoopConnector",
    "kv_connector_module_path": "benchmarks.noop_connector",
    "kv_role": "kv_both",
}


def _make(name: str, cfg: dict[str, Any], trace_file: str | None = None) -> tuple[Any, Path, float]:
    """Start engine `name` (see VARIANTS); with `trace_file`, its scheduler is the traced
    variant of benchmarks/steptrace_sched.py, writing there."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from scripts.build_tiny_model import build_model

    model = build_model()
    stats = Path(tempfile.mkdtemp(prefix=f"aqua-burst-{name}-"))
    kwargs: dict[str, Any] = {}
    if name in ("ours", "sched_only"):
        kwargs["scheduler_cls"] = engines.AQUA_SCHEDULER
        kwargs["additional_config"] = {"aqua_policy": "aqua", "aqua_stats_dir": str(stats)}
    if name in ("ours", "default_with_connector"):
        kwargs["kv_transfer_config"] = engines.aqua_kv_transfer(dram_bytes=1 << 30, stats_dir=str(stats))
    if name == "default_with_noop_connector":
        kwargs["kv_transfer_config"] = dict(NOOP_CONNECTOR)
    if trace_file is not None:
        traced = "TracingAquaScheduler" if "scheduler_cls" in kwargs else "TracingScheduler"
        kwargs["scheduler_cls"] = f"benchmarks.steptrace_sched.{traced}"
        kwargs["additional_config"] = {**kwargs.get("additional_config", {}), "steptrace_file": trace_file}
    args = AsyncEngineArgs(
        model=str(model),
        dtype="float32",
        kv_cache_memory_bytes=cfg["kv_tokens"] * engines.BYTES_PER_TOKEN,
        block_size=engines.BLOCK_SIZE,
        enable_prefix_caching=False,
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        async_scheduling=False,
        enforce_eager=True,
        seed=0,
        disable_log_stats=True,
        **kwargs,
    )
    t0 = time.perf_counter()
    with engines.engine_env():
        llm = AsyncLLM.from_engine_args(args)
    return llm, stats, time.perf_counter() - t0


# Seconds between one engine's last request and the next measured workload. vLLM 0.32's
# shared-memory message queues keep polling (sched_yield) for 1 s after their last message
# (SpinCondition.busy_loop_s in vllm/distributed/device_communicators/shm_broadcast.py), in the
# worker and in the engine core, so without a pause the engine measured next shared this 2-core
# machine with two spinning processes (SETUP_NOTES).
SWITCH_PAUSE_S = 1.5
# Measured rounds of a full run (SETUP_NOTES: 5 rounds left the throughput ratio within noise).
FULL_ROUNDS = 15
# The most --rounds (here and in aqua_steptrace.py): a round takes about 25 s (a full run's 15, 6.5
# minutes), so 100 is most of an hour; 10**30 was taken and would have run for ever.
MAX_ROUNDS = 100


def _round_order(variants: tuple[str, ...], rnd: int) -> list[str]:
    """The engines' order in round `rnd`: rotated by one each round, so that no engine always
    runs right after the same other one, or first, or last."""
    k = rnd % len(variants)
    return list(variants[k:] + variants[:k])


async def _bench(cfg: dict[str, Any], rounds: int, variants: tuple[str, ...]) -> dict[str, Any]:
    """All engines live at once; the workload alternates between them `rounds` times (in a
    rotating order, `_round_order`), so load from other processes on a shared machine hits them
    alike. Per config the round with the shortest makespan (the least disturbed) is reported;
    every round is kept in `rounds`."""
    made = {name: _make(name, cfg) for name in variants}
    out: dict[str, Any] = {}
    try:
        # One unmeasured round per engine (SETUP_NOTES), kept in the JSON as `warmup_round`.
        warmup = {name: await _workload(llm, cfg, tag="warmup") for name, (llm, _, _) in made.items()}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        idle: dict[str, list[dict[str, float]]] = {name: [] for name in IDLE_BURST_ENGINES}
        for rnd in range(rounds):
            for name in _round_order(variants, rnd):
                llm = made[name][0]
                await asyncio.sleep(SWITCH_PAUSE_S)
                res = await _workload(llm, cfg, tag=f"r{rnd}")
                res["loadavg_1m"] = os.getloadavg()[0]
                runs[name].append(res)
                if name in idle:  # right away: its own readers still spinning is in its favour
                    idle[name].append(await _idle_burst(llm, cfg, tag=f"r{rnd}"))
        out["idle_burst"] = {
            name: {
                "rounds": bursts,
                "median_ttft_p50_s": statistics.median(b["ttft_p50_s"] for b in bursts),
                "median_ttft_p99_s": statistics.median(b["ttft_p99_s"] for b in bursts),
            }
            for name, bursts in idle.items()
        }
        for name, (_, _, started) in made.items():
            best = min(runs[name], key=lambda r: r["makespan_s"])
            out[name] = dict(best)
            out[name]["rounds"] = [{k: v for k, v in r.items() if k != "ttft_all_s"} for r in runs[name]]
            out[name]["engine_start_s"] = started
            out[name]["warmup_round"] = {k: v for k, v in warmup[name].items() if k != "ttft_all_s"}
        out["resume"] = await _resume_costs(made["ours"][0], made["ours"][1])
        for name, (_, stats, _) in made.items():
            out[name]["scheduler_counters"] = read_json(stats / "scheduler.json", settle_s=0.3)
            out[name]["offload_counters"] = read_json(stats / "offload-worker.json", settle_s=0.3)
    finally:
        for llm, _, _ in made.values():
            llm.shutdown()
    return out


async def _resume_costs(llm: Any, stats: Path) -> dict[str, float]:
    """Restore seconds per token (the connector's counters) vs recompute seconds per token (an
    idle-engine prefill of a prompt as long as an average restored request)."""
    worker = read_json(stats / "offload-worker.json", settle_s=0.3)
    loads = max(1, int(worker.get("loads", 0)))
    restored_tokens = worker.get("bytes_restored", 0) / engines.BYTES_PER_TOKEN
    per_load_tokens = max(32, int(restored_tokens / loads))
    restore_s_per_token = worker.get("load_seconds", 0.0) / max(1.0, restored_tokens)

    # Recompute cost: prefill time of a prompt as long as an average restore, minus the fixed
    # per-request cost (TTFT of a 2-word prompt), on the idle engine.
    async def ttft(prompt: str, tag: str) -> tuple[float, int]:
        times, n = [], 0
        for i in range(3):
            r = await _one(llm, prompt, 1, f"{tag}-{i}", time.perf_counter())
            times.append(r["stamps"][0] - r["submit"])
            n = r["prompt_tokens"]
        return statistics.median(times), n

    long_prompt = engines.make_prompts(1, seed=99, min_words=per_load_tokens, max_words=per_load_tokens)[0]
    t_long, n_long = await ttft(long_prompt, "prefill-long")
    t_short, n_short = await ttft("hello there", "prefill-short")
    recompute_s_per_token = max(t_long - t_short, 0.0) / max(1, n_long - n_short)
    return {
        "restore_s_per_token": restore_s_per_token,
        "recompute_s_per_token": recompute_s_per_token,
        "tokens_per_restore": per_load_tokens,
        "recompute_prompt_tokens": n_long,
    }


# Output tokens of each long request in a full run. The default scheduler's burst waits for the
# long requests' remaining half, so its burst TTFT (and p99_ttft_ratio) grows with this length;
# until 2026-12-07 it was 320 (SETUP_NOTES).
FULL_LONG_TOKENS = 480
QUICK_LONG_TOKENS = 160
# Room for a long request's prompt (20-40 words) besides its output.
PROMPT_ROOM = 128
MAX_LONG_TOKENS = 4096


def burst_config(quick: bool, long_tokens: int | None = None) -> dict[str, Any]:
    """The engines' and the workload's settings (--quick: shorter outputs, a smaller burst). The
    KV cache holds `max_num_seqs` requests of `max_model_len` tokens, so the long requests fill
    most of it whatever their length."""
    if long_tokens is None:
        long_tokens = QUICK_LONG_TOKENS if quick else FULL_LONG_TOKENS
    max_model_len = max(512, -(-(long_tokens + PROMPT_ROOM) // 128) * 128)
    return {
        "n_long": 8,
        "long_tokens": long_tokens,
        "n_short": 8 if quick else 16,
        "short_tokens": 8,
        "burst_after_tokens": long_tokens // 2,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "max_model_len": max_model_len,
        "kv_tokens": 8 * max_model_len,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a short run (under 3 minutes)")
    ap.add_argument("--out", type=out_file, default=default_out("aqua_burst"))
    ap.add_argument("--html", type=out_file, default=None, help="plotly chart (default: beside --out)")
    ap.add_argument(
        "--rounds",
        type=bounded_int(1, MAX_ROUNDS),
        default=None,
        help=f"measured rounds, at most {MAX_ROUNDS} (default {FULL_ROUNDS}; 1 with --quick)",
    )
    ap.add_argument(
        "--long-tokens",
        type=bounded_int(16, MAX_LONG_TOKENS),
        default=None,
        help=f"output tokens per long request, 16 to {MAX_LONG_TOKENS} "
        f"(default {FULL_LONG_TOKENS}; {QUICK_LONG_TOKENS} with --quick)",
    )
    args = ap.parse_args()
    args.html = chart_file(ap, args.out, args.html)
    rounds = args.rounds or (1 if args.quick else FULL_ROUNDS)
    cfg = burst_config(args.quick, args.long_tokens)
    t0 = time.perf_counter()
    # --quick starts only the two engines the headline ratios compare: on a slow 2-core machine
    # an engine takes 30-55 s to start, and five of them alone outran the 3-minute budget.
    variants = VARIANTS[:2] if args.quick else VARIANTS
    runs = asyncio.run(_bench(cfg, rounds=rounds, variants=variants))
    default, ours, resume = runs["default"], runs["ours"], runs["resume"]
    attribution = {
        name: {
            "p99_ttft_ratio": default["burst_ttft_p99_s"] / runs[name]["burst_ttft_p99_s"],
            "throughput_ratio": runs[name]["throughput_tok_s"] / default["throughput_tok_s"],
            "tbt_p50_s": runs[name]["tbt_p50_s"],
            "median_round_tbt_p50_s": statistics.median(r["tbt_p50_s"] for r in runs[name]["rounds"]),
            "median_paired_throughput_ratio": _paired(default["rounds"], runs[name]["rounds"])[
                "median_throughput_ratio"
            ],
        }
        for name in variants
    }
    bw = copy_bandwidth(quick=args.quick)
    idle_p99 = runs["idle_burst"]["ours"]["median_ttft_p99_s"]
    engine_environ = engines.engine_environ()
    result = {
        "config": cfg,
        "engine_env": {k: engine_environ.get(k) for k in (RESERVED_CPUS_ENV, "VLLM_CPU_OMP_THREADS_BIND")},
        "setup_notes": SETUP_NOTES,
        "quick": args.quick,
        "rounds": rounds,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        **{name: runs[name] for name in variants},
        "attribution": attribution,
        "p99_ttft_ratio": default["burst_ttft_p99_s"] / ours["burst_ttft_p99_s"],
        "p50_ttft_ratio": default["burst_ttft_p50_s"] / ours["burst_ttft_p50_s"],
        "throughput_ratio": ours["throughput_tok_s"] / default["throughput_tok_s"],
        "paired_rounds": _paired(default["rounds"], ours["rounds"]),
        # The burst on an idle engine (see the module docstring).
        "idle_burst": runs["idle_burst"],
        "p99_ttft_ratio_ceiling": default["burst_ttft_p99_s"] / idle_p99,
        "ours_burst_p99_over_idle": ours["burst_ttft_p99_s"] / idle_p99,
        "resume_cost_ratio": resume["recompute_s_per_token"] / max(resume["restore_s_per_token"], 1e-12),
        "resume": resume,
        "copy_bandwidth_fraction": bw["fraction"],
        "copy_bandwidth": bw,
        "targets": TARGETS,
        "wall_s": time.perf_counter() - t0,
    }
    write_json_atomic(args.out, result, sort_keys=True)
    html = args.html
    _chart(result, html)
    for key, target in TARGETS.items():
        print(f"{key}: {result[key]:.3f} (target >= {target}) {'OK' if result[key] >= target else 'SHORT'}")
    print(
        f"p99_ttft_ratio_ceiling: {result['p99_ttft_ratio_ceiling']:.3f} (the default's burst p99 over "
        f"ours' on an idle engine); ours' burst p99 under load is {result['ours_burst_p99_over_idle']:.2f}x "
        "its idle one"
    )
    print(f"wrote {args.out} and {html} in {result['wall_s']:.0f} s")


def _paired(default: list[dict[str, Any]], ours: list[dict[str, Any]]) -> dict[str, Any]:
    """Context for the headline ratios (which compare each config's least disturbed round): the
    same ratios within each round (in the full run, where the order rotates, the two ran a few
    seconds to about 20 s apart), and their medians."""
    p99 = [d["burst_ttft_p99_s"] / o["burst_ttft_p99_s"] for d, o in zip(default, ours, strict=True)]
    tput = [o["throughput_tok_s"] / d["throughput_tok_s"] for d, o in zip(default, ours, strict=True)]
    return {
        "p99_ttft_ratio": p99,
        "throughput_ratio": tput,
        "median_p99_ttft_ratio": statistics.median(p99),
        "median_throughput_ratio": statistics.median(tput),
    }


def _chart(result: dict[str, Any], path: Path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Burst TTFT CDF", "Latency and throughput"))
    for name in ("default", "ours"):
        ttft = result[name]["ttft_all_s"]
        fig.add_trace(
            go.Scatter(
                x=ttft,
                y=[(i + 1) / len(ttft) for i in range(len(ttft))],
                mode="lines+markers",
                name=f"{name} TTFT",
            ),
            row=1,
            col=1,
        )
    keys = ["burst_ttft_p50_s", "burst_ttft_p99_s", "tbt_p50_s", "tbt_p99_s"]
    for name in ("default", "ours"):
        fig.add_trace(go.Bar(x=keys, y=[result[name][k] for k in keys], name=name), row=1, col=2)
    ratios = ", ".join(f"{k}={result[k]:.2f}" for k in TARGETS)
    fig.update_layout(title=f"Aqua burst on vLLM CPU (tiny Llama): {ratios}", barmode="group")
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(type="log", title_text="seconds", row=1, col=2)
    write_text_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True))


if __name__ == "__main__":
    main()
