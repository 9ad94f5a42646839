"""`python -m serving.sim`: simulate one engine serving a generated (or replayed) workload.

Example:
    python -m serving.sim --model llama-3-8b --gpu h100 --policy fcfs --workload burst \
        --rate 20 --duration 300 --seed 1 --out runs/burst

Shows a progress bar over simulated time, prints a summary table, and writes DIR/summary.json
and DIR/report.html (interactive plotly, works offline).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from serving.argtypes import bounded_int, non_negative_float, non_negative_int, positive_float, positive_int
from serving.atomic_file import write_text_atomic
from serving.costmodel.config import MODEL_CONFIGS, get_model_config
from serving.costmodel.gpus import GPU_SPECS
from serving.costmodel.presets import get_preset, kv_capacity_tokens
from serving.costmodel.transfer import nvlink
from serving.metrics.slo import SLO
from serving.metrics.summary import summarize
from serving.policies import available_policies, get_policy
from serving.sim.config import PREEMPTION_MODES, EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.events import PEER_CAPACITY, TimedChange
from serving.sim.preemption import PeerStore
from serving.sim.report import render_report
from serving.workload.datasets import available_length_dists, get_length_dist
from serving.workload.factory import WORKLOAD_KINDS, make_workload
from serving.workload.request import Request

GIB = 1 << 30
# Tensor parallelism splits each layer's attention heads evenly over the GPUs: vLLM refuses a degree
# that does not divide the model's head count (10**30 and 3 were taken and simulated).
MAX_TP = max(model.num_heads for model in MODEL_CONFIGS.values())


def _path(text: str) -> Path:
    if not text.strip():  # Path("") would silently mean the current directory
        raise argparse.ArgumentTypeError(f"{text!r} is not a path")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serving.sim", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3-8b", choices=sorted(MODEL_CONFIGS))
    p.add_argument("--gpu", default="h100", choices=sorted(GPU_SPECS))
    p.add_argument(
        "--tp",
        type=bounded_int(1, MAX_TP),
        default=1,
        help="tensor-parallel degree (GPUs per engine), a divisor of the model's attention heads",
    )
    p.add_argument("--policy", default="fcfs", choices=available_policies())
    p.add_argument("--workload", default="poisson", choices=WORKLOAD_KINDS)
    p.add_argument(
        "--rate", type=positive_float, default=None,
        help="requests/s (burst: base rate; trace: time-scale it to this mean rate, default as recorded)",
    )  # fmt: skip
    p.add_argument("--duration", type=positive_float, default=300.0, help="arrival window (s)")
    p.add_argument(
        "--dataset", default=None, choices=available_length_dists(),
        help="length distribution of a generated workload (default sharegpt; a trace has its own)",
    )  # fmt: skip
    p.add_argument("--trace", type=_path, default=None, help="CSV trace for --workload trace")
    p.add_argument(
        "--seed", type=non_negative_int, default=None,
        help="seed of a generated workload (default 0; a trace is replayed, drawing nothing)",
    )  # fmt: skip
    p.add_argument(
        "--predict", default="none", choices=("none", "oracle"),
        help="response-length predictions for the policy: none, or each request's true length",
    )  # fmt: skip
    p.add_argument("--out", required=True, type=_path, help="output directory (created if missing)")
    g = p.add_argument_group("engine")
    g.add_argument("--preemption-mode", default="recompute", choices=PREEMPTION_MODES)
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=2048)
    g.add_argument("--max-num-seqs", type=positive_int, default=256)
    g.add_argument("--block-size", type=positive_int, default=16)
    g.add_argument("--kv-blocks", type=positive_int, default=None, help="KV capacity in blocks (overrides)")
    g.add_argument(
        "--gpu-memory-utilization", type=positive_float, default=0.9,
        help="fraction of GPU memory for weights + KV, as vLLM's flag (default 0.9)",
    )  # fmt: skip
    g.add_argument("--peer-memory-gib", type=non_negative_float, default=0.0, help="lent GiB (offload_peer)")
    g.add_argument("--reclaim-at", type=non_negative_float, default=None, help="time (s) of a reclaim")
    s = p.add_argument_group("SLO")
    s.add_argument("--ttft-slo-ms", type=positive_float, default=1000.0, help="TTFT target (default 1000)")
    s.add_argument("--tbt-slo-ms", type=positive_float, default=100.0, help="TPOT target (default 100)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    heads = get_model_config(a.model).num_heads
    if a.tp > heads:
        p.error(f"--tp {a.tp} is more than the {heads} attention heads of {a.model}: each GPU needs one")
    if heads % a.tp:
        p.error(
            f"--tp {a.tp} does not divide the {heads} attention heads of {a.model}: each GPU gets as many"
        )
    if a.workload == "trace" and a.trace is None:
        p.error("--workload trace needs --trace PATH")
    if a.workload != "trace" and a.trace is not None:  # it was silently ignored
        p.error(f"--trace {a.trace} is only read with --workload trace, not --workload {a.workload}")
    if a.workload == "trace":  # both were silently ignored: a trace brings its lengths and draws nothing
        if a.dataset is not None:
            p.error(f"--dataset {a.dataset} is only read by generated workloads, not --workload trace")
        if a.seed is not None:
            p.error(f"--seed {a.seed} is only used by generated workloads, not --workload trace")
    else:
        a.dataset = "sharegpt" if a.dataset is None else a.dataset
        a.seed = 0 if a.seed is None else a.seed
    if a.workload != "trace" and a.rate is None:
        p.error(f"--workload {a.workload} needs --rate")
    if a.gpu_memory_utilization > 1:
        p.error(f"--gpu-memory-utilization {a.gpu_memory_utilization} must be in (0, 1]")
    if a.peer_memory_gib and a.preemption_mode != "offload_peer":
        p.error(f"--peer-memory-gib {a.peer_memory_gib} needs --preemption-mode offload_peer")
    if math.isinf(a.peer_memory_gib * GIB):  # 1e300 GiB is no byte count (int() of inf raised)
        p.error(f"--peer-memory-gib {a.peer_memory_gib} is too large to count in bytes")
    if a.reclaim_at is not None and not a.peer_memory_gib:
        p.error("--reclaim-at needs --peer-memory-gib")
    try:
        if a.out.exists() and not a.out.is_dir():
            p.error(f"--out {a.out} exists and is not a directory")
    except OSError as exc:  # Path.exists() raises for a name over NAME_MAX ("File name too long")
        p.error(f"--out {a.out}: {exc.strerror or exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    _check(parser, a)
    try:
        cost = get_preset(a.model, a.gpu, a.tp)
        blocks = a.kv_blocks
        if blocks is None:
            tokens = kv_capacity_tokens(a.model, a.gpu, a.tp, a.gpu_memory_utilization)
            if tokens < 1:
                parser.error(f"--gpu-memory-utilization {a.gpu_memory_utilization} leaves no room for KV")
            blocks = tokens // a.block_size
            if blocks < 1:
                parser.error(f"--block-size {a.block_size} is more than the {tokens} KV tokens that fit")
        config = EngineConfig(
            max_num_batched_tokens=a.max_num_batched_tokens,
            max_num_seqs=a.max_num_seqs,
            block_size=a.block_size,
            num_kv_blocks=blocks,
            preemption_mode=a.preemption_mode,
            peer_capacity_bytes=int(a.peer_memory_gib * GIB),
        )
        kw: dict[str, Any] = {}
        requests: list[Request]
        if a.workload == "trace":
            requests = make_workload("trace", a.rate, a.duration, path=a.trace)
        else:
            # Generated prompts are cut to the model's context window, as the dataset module does
            # for its own window (LongBench truncates a document that exceeds it); without this a
            # longbench run on llama-2-13b (4,096 tokens) simulated 8,700-token prompts.
            window = min(get_model_config(a.model).max_context, get_length_dist(a.dataset).max_context)
            kw = {"max_context": window}
            requests = make_workload(a.workload, a.rate, a.duration, a.dataset, a.seed, **kw)
        slo = SLO(a.ttft_slo_ms / 1e3, a.tbt_slo_ms / 1e3)
    except UnicodeDecodeError as exc:
        parser.error(f"--trace {a.trace}: not a UTF-8 text file ({exc.reason} at byte {exc.start})")
    except MemoryError:  # numpy cannot allocate the arrival times (e.g. --rate 1e9 --duration 300)
        parser.error(f"--rate {a.rate} over --duration {a.duration} is more requests than fit in memory")
    except OSError as exc:  # only the trace is read from disk here
        parser.error(f"--trace {a.trace}: cannot read it ({exc.strerror or exc})")
    except ValueError as exc:
        parser.error(str(exc))
    if not requests:
        if a.workload == "trace":
            parser.error(f"--trace {a.trace} holds no requests")
        parser.error(f"--rate {a.rate} over --duration {a.duration} draws no requests (seed {a.seed})")
    try:  # now, not after a long simulation
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out {a.out}: cannot create it ({exc.strerror})")
    # The arrival window: --duration for a generated workload; a trace's ends with its last arrival
    # (--duration, 300 s by default, only cuts it), so a 10 s trace is not measured over 300 s.
    window = a.duration if a.workload != "trace" else min(a.duration, requests[-1].arrival)
    changes = [] if a.reclaim_at is None else [TimedChange(a.reclaim_at, PEER_CAPACITY, 0, 0)]
    # Lent memory is reached over the GPU's own NVLink (NVLink 3 on an A100, 4 on an H100).
    store = (
        PeerStore(config.peer_capacity_bytes, nvlink(a.gpu)) if a.preemption_mode == "offload_peer" else None
    )
    engine = EngineSim(cost, config, get_policy(a.policy), store=store)
    t0 = time.perf_counter()
    with tqdm(
        total=round(window), unit="sim-s", disable=a.no_progress, file=sys.stderr, desc=cost.name
    ) as bar:

        def progress(now: float) -> None:
            bar.update(int(now) - bar.n)

        predictions = {r.req_id: r.output_tokens for r in requests} if a.predict == "oracle" else None
        records = engine.run(requests, changes=changes, progress=progress, predictions=predictions)
        progress(engine.now)
    wall = time.perf_counter() - t0
    # The run ends with its last token, not at a later --reclaim-at the engine idled to apply.
    last_token = max((r.token_times[-1] for r in records if r.token_times), default=0.0)
    # (A trace whose requests all arrive at 0 and are refused has no span: its throughput is 0.)
    span = max(last_token, window) or a.duration
    summary = summarize(records, span, slo)
    run_info = {
        "model": a.model, "gpu": a.gpu, "tp": a.tp, "policy": a.policy, "workload": a.workload,
        "rate": a.rate, "duration_s": window, "seed": a.seed, "predict": a.predict,
        "dataset": a.dataset,  # None for a trace: it brings its own lengths (and seed None: draws nothing)
        "trace": None if a.trace is None else str(a.trace),
        "ttft_slo_s": slo.ttft_s, "tbt_slo_s": slo.tbt_s, "preemption_mode": a.preemption_mode,
        "kv_blocks": blocks, "block_size": a.block_size, "max_num_batched_tokens": a.max_num_batched_tokens,
        "max_num_seqs": a.max_num_seqs, "max_context": kw.get("max_context"),
        "simulated_s": engine.now, "wall_s": wall,
        "iterations": engine.stats.iterations, "rejected": engine.stats.rejected,
    }  # fmt: skip
    doc: dict[str, Any] = {k: (None if math.isnan(v) else v) for k, v in summary.items()}
    doc["run"] = run_info
    if a.workload == "trace":  # (no seed: a replay draws nothing)
        pace = "as recorded" if a.rate is None else f"@ {a.rate} req/s"
        title = f"{cost.name} · {a.policy} · trace {a.trace.name} {pace} · {len(requests)} requests"
    else:
        title = f"{cost.name} · {a.policy} · {a.workload} @ {a.rate} req/s · seed {a.seed}"
    html = render_report(records, title)  # both rendered before either is written
    write_text_atomic(a.out / "report.html", html)
    write_text_atomic(a.out / "summary.json", json.dumps(doc, indent=2) + "\n")
    print(format_table(summary, run_info))
    print(f"wrote {a.out / 'summary.json'} and {a.out / 'report.html'}")
    return 0


def format_table(summary: dict[str, float], run: dict[str, Any]) -> str:
    """The summary as an aligned two-column table (latencies in ms)."""
    rows = [
        (
            "requests",
            f"{summary['requests']:.0f} ({summary['finished']:.0f} done, {run['rejected']} too long)",
        ),
        ("simulated / wall", f"{run['simulated_s']:.1f} s / {run['wall_s']:.2f} s"),
    ]
    for key in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "tpot_p50", "e2e_p50", "e2e_p99"):
        rows.append((key, f"{summary[key] * 1e3:.1f} ms"))
    rows += [
        ("throughput", f"{summary['throughput_tokens_per_s']:.1f} tokens/s"),
        ("preemptions", f"{summary['preemptions']:.0f}"),
        ("KV bytes moved", f"{summary['bytes_moved'] / GIB:.2f} GiB"),
        (
            "SLO attainment",
            f"{summary['attainment'] * 100:.1f}% (TTFT <= {run['ttft_slo_s'] * 1e3:g} ms, "
            f"TPOT <= {run['tbt_slo_s'] * 1e3:g} ms)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
