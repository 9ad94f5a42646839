"""EcoServe vs FCFS (vLLM V1) on a ShareGPT-like workload, one simulated llama-2-13b on one A100.

Workload: Poisson arrivals; each request carries a prompt from the synthetic corpus
(serving/predictor/corpus.py: six task categories whose mix has ShareGPT-like means, ~160 prompt /
~300 response tokens). A ridge predictor trained on a disjoint seed gives each request a predicted
response length (its held-out MAE and bucket accuracy are reported).
Hardware: the llama-2-13b@a100 cost-model preset, KV capacity from kv_capacity_tokens (90% of 80 GB
minus weights), max_num_batched_tokens 2048, max_num_seqs 256, recompute preemption; identical for
both policies.
SLOs (goodput = highest rate with >= 90% of requests meeting both targets, serving.metrics.goodput):
  "feasible"  TTFT 1.0 s, TPOT 0.1 s: the headline. Every request of the corpus can meet it when
              served alone (the longest prompts, ~4k tokens, prefill in ~0.7 s on this preset).
  "chatbot"   TTFT 0.25 s, TPOT 0.1 s: DistServe's (OSDI'24, Table 1) chatbot SLO for a 13B model
              on ShareGPT. On this corpus ~7% of requests (long summarisation prompts, whose
              prefill alone exceeds 0.25 s) miss it at any load, so goodput there measures how fast
              the last 3% of slack is used up, and both policies hit that floor at about the same
              rate; it is reported beside the headline.

Keys: goodput_ratio (EcoServe / FCFS, headline SLO), goodput_fcfs, goodput_ecoserve, the same for
the chatbot SLO (suffix _chatbot_slo), ablations under the headline SLO (full runs:
goodput_ecoserve_no_pipelining, goodput_ecoserve_no_reservation, goodput_ecoserve_no_time_sync),
attainment of every variant at `fixed_rate`, the attainment-vs-rate curves, and the predictor's
error.

    python benchmarks/ecoserve.py [--quick] [--out PATH] [--html PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.costmodel import get_preset, kv_capacity_tokens
from serving.metrics import SLO, attainment, goodput
from serving.policies import SchedulingPolicy, get_policy
from serving.predictor import LengthPredictor, make_corpus, prompt_workload, train_predictor
from serving.predictor.corpus import PromptSample
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim

MODEL, GPU = "llama-2-13b", "a100"
SLOS: dict[str, SLO] = {"feasible": SLO(ttft_s=1.0, tbt_s=0.1), "chatbot": SLO(ttft_s=0.25, tbt_s=0.1)}
VARIANTS: dict[str, dict[str, Any]] = {
    "fcfs": {},
    "ecoserve": {},
    "ecoserve_no_pipelining": {"pipelining": False},
    "ecoserve_no_reservation": {"reserve": False},
    "ecoserve_no_time_sync": {"sync_factor": 1e6},
}


def make_policy(variant: str, slo: SLO) -> SchedulingPolicy:
    if variant == "fcfs":
        return get_policy("fcfs")
    cost = get_preset(MODEL, GPU)
    return get_policy("ecoserve", ttft_slo_s=slo.ttft_s, tpot_slo_s=slo.tbt_s, cost=cost, **VARIANTS[variant])


class Bench:
    """Runs one variant at one rate on the fixed hardware and workload seed."""

    def __init__(self, duration_s: float, seed: int, predictor: LengthPredictor) -> None:
        self.duration_s = duration_s
        self.seed = seed
        self.predictor = predictor
        self.cost = get_preset(MODEL, GPU)
        self.config = EngineConfig(
            max_num_batched_tokens=2048, max_num_seqs=256, num_kv_blocks=kv_capacity_tokens(MODEL, GPU) // 16
        )
        self.corpus: list[PromptSample] = make_corpus(int(duration_s * 40) + 100, seed=seed)
        self.curves: dict[str, dict[float, float]] = {}  # "slo/variant" -> rate -> attainment

    def attainment(self, slo: str, variant: str, rate: float) -> float:
        rate = round(rate, 4)
        pts = self.curves.setdefault(f"{slo}/{variant}", {})
        if rate not in pts:
            wl = prompt_workload(rate, self.duration_s, seed=self.seed, corpus=self.corpus)
            engine = EngineSim(self.cost, self.config, make_policy(variant, SLOS[slo]))
            recs = engine.run(wl.requests, predictions=wl.predictions(self.predictor))
            pts[rate] = attainment(recs, SLOS[slo])
        return pts[rate]

    def goodput(self, slo: str, variant: str, rel_tol: float) -> float:
        return goodput(lambda r: self.attainment(slo, variant, r), 0.9, lo=2.0, hi=8.0, rel_tol=rel_tol)


def write_html(path: Path, curves: dict[str, dict[float, float]], goodputs: dict[str, float]) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, pts in curves.items():
        xs = sorted(pts)
        name = f"{key} (goodput {goodputs[key]:.2f} req/s)"
        fig.add_trace(go.Scatter(x=xs, y=[pts[x] for x in xs], mode="lines+markers", name=name))
    fig.add_hline(y=0.9, line_dash="dot", annotation_text="90% target")
    fig.update_layout(
        title=f"SLO attainment vs rate: {MODEL}@{GPU}, ShareGPT-like corpus; "
        "feasible = TTFT 1 s / TPOT 0.1 s, chatbot = TTFT 0.25 s / TPOT 0.1 s",
        xaxis_title="request rate (req/s)",
        yaxis_title="SLO attainment",
    )
    fig.write_html(str(path), include_plotlyjs="cdn")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 s workloads, coarser goodput search")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ecoserve.json"))
    ap.add_argument("--html", type=Path, default=None, help="plot path (default: --out with .html)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixed-rate", type=float, default=5.0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    predictor = train_predictor(n=2000 if args.quick else 4000)
    held_out = make_corpus(1000, seed=args.seed + 777)
    report = predictor.evaluate([s.text for s in held_out], [s.output_tokens for s in held_out])
    bench = Bench(60.0 if args.quick else 180.0, args.seed, predictor)
    rel_tol = 0.05 if args.quick else 0.02
    runs = [("feasible", "fcfs"), ("feasible", "ecoserve"), ("chatbot", "fcfs"), ("chatbot", "ecoserve")]
    if not args.quick:
        runs += [("feasible", v) for v in VARIANTS if v not in ("fcfs", "ecoserve")]
    goodputs = {f"{slo}/{v}": bench.goodput(slo, v, rel_tol) for slo, v in runs}
    fixed = {f"{slo}/{v}": bench.attainment(slo, v, args.fixed_rate) for slo, v in runs}

    def ratio(slo: str) -> float:
        base = goodputs[f"{slo}/fcfs"]
        return goodputs[f"{slo}/ecoserve"] / base if base > 0 else float("inf")

    def key(run: str) -> str:
        slo, v = run.split("/")
        return v if slo == "feasible" else f"{v}_chatbot_slo"

    out: dict[str, Any] = {
        "goodput_ratio": ratio("feasible"),
        "target_goodput_ratio": 2.5,
        "goodput_ratio_chatbot_slo": ratio("chatbot"),
        **{f"goodput_{key(k)}": g for k, g in goodputs.items()},
        "fixed_rate": args.fixed_rate,
        **{f"attainment_{key(k)}_at_fixed_rate": a for k, a in fixed.items()},
        "slos": {
            k: {"ttft_s": v.ttft_s, "tpot_s": v.tbt_s, "target_attainment": 0.9} for k, v in SLOS.items()
        },
        "headline_slo": "feasible",
        "hardware": f"{MODEL}@{GPU}",
        "duration_s": bench.duration_s,
        "predictor": {
            "mae_tokens": report.mae,
            "mean_baseline_mae_tokens": report.mean_baseline_mae,
            "bucket_accuracy": report.bucket_accuracy,
            "within_one_bucket": report.within_one_bucket,
            "held_out_samples": report.samples,
        },
        "curves": {k: {str(r): a for r, a in sorted(pts.items())} for k, pts in bench.curves.items()},
        "quick": args.quick,
        "wall_seconds": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    html = args.html or args.out.with_suffix(".html")
    write_html(html, bench.curves, goodputs)
    for k in goodputs:
        print(
            f"{k:>34}: goodput {goodputs[k]:.2f} req/s, attainment at {args.fixed_rate} req/s {fixed[k]:.3f}"
        )
    print(
        f"goodput_ratio (EcoServe / FCFS, TTFT 1 s / TPOT 0.1 s) = {out['goodput_ratio']:.2f}",
        "(target >= 2.5)",
    )
    print(
        "goodput_ratio under the chatbot SLO (TTFT 0.25 s / TPOT 0.1 s) =",
        f"{out['goodput_ratio_chatbot_slo']:.2f}",
    )
    print(
        f"predictor: MAE {report.mae:.1f} tokens vs {report.mean_baseline_mae:.1f} predicting the mean; "
        f"bucket accuracy {report.bucket_accuracy:.2f}"
    )
    print(f"wrote {args.out} and {html} in {out['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
