"""EcoServe vs FCFS (vLLM V1, and paper-era vLLM V0) on a ShareGPT-like workload, llama-2-13b@A100.

Workload: Poisson arrivals; each request carries a prompt from the synthetic corpus
(serving/predictor/corpus.py: six task categories whose mix has ShareGPT-like means, ~160 prompt /
~300 response tokens). A ridge predictor trained on a disjoint seed gives each request a predicted
response length (its held-out MAE and bucket accuracy are reported). A request's category is its
application, which is its SLO class under the per-application SLO.
Hardware: the llama-2-13b@a100 cost-model preset; KV capacity from kv_capacity_tokens (90% of 80 GB
minus weights); max_num_seqs 256, recompute preemption, identical for every policy. Beside it, a
memory-constrained setting: the KV capacity of a 40 GB A100 (same cost model), where KV runs out
at about half the rate.
Baselines (both FCFS, the policy of vLLM's default scheduler):
  fcfs     vLLM V1: chunked prefill with a 2,048-token budget, decodes first and prompts fill the rest.
           This is the scheduler of the vLLM the project ships (0.32) and the one `goodput_ratio`
           uses: the stronger baseline, and the one an EcoServe plug-in would replace.
  fcfs_v0  the vLLM of EcoServe's paper (arXiv 2411.06364, 2024): V0's default scheduler, whole
           prompts in prefill-only iterations that stall decodes, a 4,096-token budget, a 1%
           free-block watermark (serving/sim/v0.py); ratios against it carry the suffix _vs_vllm_v0.
SLOs (goodput = highest rate with >= 90% of requests meeting both targets, serving.metrics.goodput):
  "per_app"   the headline. Per-request SLOs by application, since EcoServe's SLOs differ by
              application and request: DistServe's (OSDI'24, Table 1) per-application SLOs, chatbot
              (ShareGPT) TTFT 0.25 s / TPOT 0.1 s for chat, qa, translate and write requests, code
              completion (HumanEval) 0.125 s / 0.2 s for code, summarisation (LongBench) 15 s /
              0.15 s for summarise. About 4% of requests (chat prompts above ~1,500 tokens, whose
              prefill alone exceeds 0.25 s) miss it at any load.
  "feasible"  TTFT 1.0 s, TPOT 0.1 s for every request (the previous headline). Every request of
              the corpus can meet it when served alone.
  "chatbot"   TTFT 0.25 s, TPOT 0.1 s for every request: DistServe's chatbot SLO applied to all,
              which the long summarisation prompts (~7% of requests) can never meet.

Keys: goodput_ratio (EcoServe / FCFS V1, headline SLO, 80 GB), goodput_ratio_vs_vllm_v0, the same
for the other SLOs (goodput_ratio_<slo>_slo[_vs_vllm_v0]) and for the 40 GB setting
(goodput_ratio_a100_40gb[_vs_vllm_v0]); goodput_<variant>[_<slo>_slo][_a100_40gb]; ablations under
the headline SLO (full runs: goodput_ecoserve_no_pipelining, _no_reservation, _no_time_sync,
_no_late_gate); two references under the headline SLO, EcoServe given true response lengths and
clairvoyant shedding (goodput_ratio_ecoserve_true_lengths, goodput_ratio_clairvoyant_shed,
clairvoyant_shed_fraction_by_rate; see SHED_FRACTIONS); an upper bound on any scheduler from GPU
work alone (goodput_gpu_work_bound, goodput_ratio_gpu_work_bound; benchmarks/ecoserve_bound.py);
attainment of every run at `fixed_rate`
(below the knee) and `overload_rate` (above it) and its preemptions at the latter; the
attainment-vs-rate curves; the predictor's error.

    python benchmarks/ecoserve.py [--quick] [--out PATH] [--html PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_io import chart_file, default_out, non_negative_int, out_file, positive_float
from benchmarks.ecoserve_bound import bound_rate, gpu_load
from serving.atomic_file import write_json_atomic, write_text_atomic
from serving.costmodel import get_preset, kv_capacity_tokens
from serving.costmodel.presets import get_model_config
from serving.metrics import SLO, attainment, goodput
from serving.policies import SchedulingPolicy, get_policy
from serving.predictor import LengthPredictor, make_corpus, prompt_workload, train_predictor
from serving.predictor.corpus import PromptSample
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.workload import Request

MODEL, GPU = "llama-2-13b", "a100"
CHATBOT = SLO(ttft_s=0.25, tbt_s=0.1)
# Per-application SLOs of DistServe (OSDI'24) Table 1: chatbot (ShareGPT), code completion
# (HumanEval), summarisation (LongBench); the corpus's chat, qa, translate and write requests are
# ShareGPT-style chatbot traffic.
PER_APP: dict[str | None, SLO] = {
    None: CHATBOT,
    "code": SLO(ttft_s=0.125, tbt_s=0.2),
    "summarise": SLO(ttft_s=15.0, tbt_s=0.15),
}
HEADLINE = "per_app"
SLOS: dict[str, SLO | dict[str | None, SLO]] = {
    "feasible": SLO(ttft_s=1.0, tbt_s=0.1),
    "chatbot": CHATBOT,
    "per_app": PER_APP,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "fcfs": {},
    "fcfs_v0": {},
    "ecoserve": {},
    "ecoserve_no_pipelining": {"pipelining": False},
    "ecoserve_no_reservation": {"reserve": False},
    "ecoserve_no_time_sync": {"sync_factor": 1e6},
    "ecoserve_no_late_gate": {"late_kv_share": 1.0},
    # References, not policies: EcoServe given every request's true response length, and the same
    # with clairvoyant shedding (below).
    "ecoserve_true_lengths": {},
    "clairvoyant_shed": {},
}
TRUE_LENGTHS = {"ecoserve_true_lengths", "clairvoyant_shed"}
# clairvoyant_shed: at each rate, the best of never serving the costliest 0-10% of requests (by
# KV-time, (prompt + output / 2) x output tokens, known in advance) and serving the rest with
# EcoServe on true lengths; the requests left out count as misses. Shedding more than 10% cannot
# reach 90% attainment. No scheduler can know all this, so its goodput bounds what reordering and
# admission alone could gain on this workload.
SHED_FRACTIONS = (0.0, 0.025, 0.05, 0.075, 0.1)
# KV capacities: the 80 GB A100 at vLLM's default 0.9 memory utilisation, and the same GPU limited
# to 40 GB (the A100-40GB), a memory-constrained setting where KV runs out first.
KV_TOKENS: dict[str, int] = {"a100_80gb": kv_capacity_tokens(MODEL, GPU)}
KV_TOKENS["a100_40gb"] = int(
    (0.9 * 40 * 2**30 - get_model_config(MODEL).weight_bytes())
    // get_model_config(MODEL).kv_bytes_per_token()
)


def without_costliest(reqs: list[Request], frac: float) -> list[Request]:
    """`reqs` (in arrival order) less the costliest `frac` of them by KV-time, (prompt + output / 2)
    x output tokens: what a clairvoyant policy sheds."""
    n_out = round(frac * len(reqs))
    if n_out == 0:
        return reqs
    kv_time = sorted(reqs, key=lambda r: (r.prompt_tokens + r.output_tokens / 2) * r.output_tokens)
    costliest = {id(r) for r in kv_time[-n_out:]}
    return [r for r in reqs if id(r) not in costliest]


def make_policy(variant: str, slo: SLO | dict[str | None, SLO]) -> SchedulingPolicy:
    if variant.startswith("fcfs"):
        return get_policy("fcfs")
    cost = get_preset(MODEL, GPU)
    if isinstance(slo, SLO):
        base, classes = slo, None
    else:
        base = slo[None]
        classes = {k: (v.ttft_s, v.tbt_s) for k, v in slo.items() if k is not None}
    return get_policy(
        "ecoserve",
        ttft_slo_s=base.ttft_s,
        tpot_slo_s=base.tbt_s,
        class_slos=classes,
        cost=cost,
        **VARIANTS[variant],
    )


def make_config(variant: str, kv_tokens: int) -> EngineConfig:
    """vLLM V1 (chunked prefill, 2,048-token budget) for all but fcfs_v0: paper-era vLLM V0, whole
    prompts in prefill-only iterations with V0's default budget max(max_model_len, 2048) = 4,096."""
    if variant == "fcfs_v0":
        return EngineConfig(
            max_num_batched_tokens=4096, max_num_seqs=256, num_kv_blocks=kv_tokens // 16, scheduler="v0"
        )
    return EngineConfig(max_num_batched_tokens=2048, max_num_seqs=256, num_kv_blocks=kv_tokens // 16)


# Requests/s the workload corpus covers: Bench draws int(duration_s * CORPUS_RATE) + 100 prompts.
CORPUS_RATE = 40
# The largest --fixed-rate / --overload-rate: Poisson arrivals at 35/s stay under that corpus (by 8.7
# standard deviations for --quick's 60 s); 45/s was accepted and, after the minutes of goodput
# searches, raised "corpus has 2500 prompts, the workload needs 2683".
MAX_RATE = 35.0


def rate_arg(text: str) -> float:
    """argparse type of --fixed-rate / --overload-rate: a positive rate the corpus covers."""
    value = positive_float(text)
    if value > MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than the {MAX_RATE:g} requests/s the corpus covers"
        )
    return value


class Bench:
    """Runs one variant at one rate on the fixed workload seed; runs are keyed "hw/slo/variant"."""

    def __init__(self, duration_s: float, seed: int, predictor: LengthPredictor) -> None:
        self.duration_s = duration_s
        self.seed = seed
        self.predictor = predictor
        self.cost = get_preset(MODEL, GPU)
        self.corpus: list[PromptSample] = make_corpus(int(duration_s * CORPUS_RATE) + 100, seed=seed)
        self.curves: dict[str, dict[float, float]] = {}  # "hw/slo/variant" -> rate -> attainment
        self.preemptions: dict[str, dict[float, int]] = {}  # same keys -> rate -> preemptions
        self.shed: dict[float, float] = {}  # rate -> the fraction clairvoyant_shed left out

    def attainment(self, run: str, rate: float) -> float:
        hw, slo, variant = run.split("/")
        rate = round(rate, 4)
        pts = self.curves.setdefault(run, {})
        if rate not in pts:
            wl = prompt_workload(rate, self.duration_s, seed=self.seed, corpus=self.corpus)
            # The application a request comes from is its SLO class (used by the per_app SLO).
            reqs = [
                dataclasses.replace(r, slo_class=s.category)
                for r, s in zip(wl.requests, wl.samples, strict=True)
            ]
            if variant in TRUE_LENGTHS:
                preds = {r.req_id: r.output_tokens for r in reqs}
            else:
                preds = wl.predictions(self.predictor)
            fractions = SHED_FRACTIONS if variant == "clairvoyant_shed" else (0.0,)
            best = (-1.0, 0, 0.0)  # attainment, preemptions, fraction left out
            for frac in fractions:
                kept = without_costliest(reqs, frac)
                engine = EngineSim(
                    self.cost, make_config(variant, KV_TOKENS[hw]), make_policy(variant, SLOS[slo])
                )
                recs = engine.run(kept, predictions=preds)
                met = attainment(recs, SLOS[slo]) * len(kept) / len(reqs)
                best = max(best, (met, engine.stats.preemptions, frac), key=lambda b: b[0])
            pts[rate], self.preemptions.setdefault(run, {})[rate] = best[0], best[1]
            if variant == "clairvoyant_shed":
                self.shed[rate] = best[2]
        return pts[rate]

    def goodput(self, run: str, rel_tol: float) -> float:
        lo, hi = (1.0, 4.0) if run.startswith("a100_40gb") else (2.0, 8.0)
        return goodput(lambda r: self.attainment(run, r), 0.9, lo=lo, hi=hi, rel_tol=rel_tol)

    def work_bound(self) -> float:
        """The rate above which no scheduler can reach 90% attainment for lack of GPU time
        (benchmarks/ecoserve_bound.py), on the same arrivals as the runs."""
        seqs = make_config("ecoserve", KV_TOKENS["a100_80gb"]).max_num_seqs

        def load(rate: float) -> float:
            wl = prompt_workload(rate, self.duration_s, seed=self.seed, corpus=self.corpus)
            return gpu_load(self.cost, wl.requests, self.duration_s, 0.9, seqs)

        return bound_rate(load, lo=1.0, hi=MAX_RATE)


SETUP_NOTES: dict[str, str] = {
    "headline_slo": "per_app: EcoServe (arXiv 2411.06364) judges requests by per-request SLOs that "
    "differ by application; the values are DistServe's (OSDI'24, Table 1) per-application SLOs, a "
    "request's application being its corpus category (chat, qa, translate, write = chatbot).",
    "fcfs": "vLLM V1 scheduler: chunked prefill, max_num_batched_tokens 2048, decodes first, on-demand "
    "block allocation, recompute preemption of the last-admitted request, no admission in a step "
    "that preempted. The scheduler of the vLLM the project ships; goodput_ratio is against it.",
    "fcfs_v0": "paper-era vLLM V0 default scheduler (vLLM 0.2-0.5 Scheduler._schedule_default): whole "
    "prompts in prefill-only iterations, max_num_batched_tokens = max(max_model_len, 2048) = 4096, "
    "1% free-block watermark, recompute preemption (serving/sim/v0.py).",
    "a100_40gb": "memory-constrained: KV capacity of a 40 GB A100 at 0.9 memory utilisation beside "
    "llama-2-13b's weights; compute from the 80 GB preset (the 40 GB part's lower HBM bandwidth is "
    "not modelled).",
    "late_gate": "EcoServe orders both queues by SLO urgency; requests whose TTFT is already lost are "
    "admitted only while running requests hold <= late_kv_share (0.5) of the KV cache; all finish.",
    "clairvoyant_shed": "a reference, not a policy: at each rate the best of leaving out the "
    "costliest 0-10% of requests (KV-time (prompt + output / 2) x output, known in advance; left-out "
    "requests count as misses) and serving the rest with EcoServe given true response lengths. "
    "ecoserve_true_lengths is EcoServe given true lengths, shedding nothing.",
    "gpu_work_bound": "a bound, not a run: the highest rate at which the cost model's GPU time of "
    "the cheapest 90% of requests (prefill and decode work, and the fixed cost of the iterations "
    "their decode steps need at max_num_seqs per iteration) fits in one GPU-second per second; it "
    "ignores the KV cache, queueing and every latency target "
    "(benchmarks/ecoserve_bound.py). goodput_ratio_gpu_work_bound = it / FCFS V1's goodput: no "
    "scheduler's goodput_ratio can exceed it on this workload and hardware.",
    "not_modelled": "vLLM V1 prefix caching (a recomputed request may hit its own freed blocks, "
    "making recompute preemption cheaper for FCFS); the paper's exact SLO definitions and models.",
}


def slo_json(slo: SLO | dict[str | None, SLO]) -> dict[str, Any]:
    if isinstance(slo, SLO):
        return {"ttft_s": slo.ttft_s, "tpot_s": slo.tbt_s}
    return {str(k or "default"): slo_json(v) for k, v in slo.items()}


def write_html(path: Path, curves: dict[str, dict[float, float]], goodputs: dict[str, float]) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, pts in curves.items():
        xs = sorted(pts)
        name = f"{key} (goodput {goodputs[key]:.2f} req/s)"
        fig.add_trace(go.Scatter(x=xs, y=[pts[x] for x in xs], mode="lines+markers", name=name))
    fig.add_hline(y=0.9, line_dash="dot", annotation_text="90% target")
    fig.update_layout(
        title=f"SLO attainment vs rate: {MODEL}@{GPU} (KV of 80 / 40 GB), ShareGPT-like corpus; "
        "SLOs per_app (DistServe Table 1 by application), feasible (1 s / 0.1 s), chatbot (0.25 s / 0.1 s)",
        xaxis_title="request rate (req/s)",
        yaxis_title="SLO attainment",
    )
    write_text_atomic(path, fig.to_html(include_plotlyjs="cdn"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 s workloads, coarser goodput search")
    ap.add_argument("--out", type=out_file, default=default_out("ecoserve"))
    ap.add_argument("--html", type=out_file, default=None, help="plot path (default: --out with .html)")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--fixed-rate", type=rate_arg, default=5.0, help=f"requests/s, at most {MAX_RATE:g}")
    ap.add_argument("--overload-rate", type=rate_arg, default=7.0, help=f"requests/s, at most {MAX_RATE:g}")
    args = ap.parse_args(argv)
    args.html = chart_file(ap, args.out, args.html)
    t0 = time.perf_counter()
    predictor = train_predictor(n=2000 if args.quick else 4000)
    held_out = make_corpus(1000, seed=args.seed + 777)
    report = predictor.evaluate([s.text for s in held_out], [s.output_tokens for s in held_out])
    bench = Bench(60.0 if args.quick else 180.0, args.seed, predictor)
    rel_tol = 0.05 if args.quick else 0.02
    main_runs = ["fcfs", "fcfs_v0", "ecoserve"]
    runs = [f"a100_80gb/{slo}/{v}" for slo in SLOS for v in main_runs]
    runs += [f"a100_40gb/{HEADLINE}/{v}" for v in main_runs]
    references = ["ecoserve_true_lengths", "clairvoyant_shed"]
    runs += [f"a100_80gb/{HEADLINE}/{v}" for v in references]
    if not args.quick:
        runs += [f"a100_80gb/{HEADLINE}/{v}" for v in VARIANTS if v not in main_runs + references]
    goodputs = {run: bench.goodput(run, rel_tol) for run in runs}
    work_bound = bench.work_bound()
    # One rate below the knee and one above it on each hardware (the 40 GB rates scaled by its KV).
    rates = {"a100_80gb": (args.fixed_rate, args.overload_rate), "a100_40gb": (2.5, 3.5)}
    fixed = {run: bench.attainment(run, rates[run.split("/")[0]][0]) for run in runs}
    over = {run: bench.attainment(run, rates[run.split("/")[0]][1]) for run in runs}

    def ratio(hw: str, slo: str, base: str = "fcfs") -> float:
        g = goodputs[f"{hw}/{slo}/{base}"]
        return goodputs[f"{hw}/{slo}/ecoserve"] / g if g > 0 else float("inf")

    def key(run: str) -> str:
        hw, slo, v = run.split("/")
        return v + ("" if slo == HEADLINE else f"_{slo}_slo") + ("" if hw == "a100_80gb" else f"_{hw}")

    def pre(run: str, rate: float) -> int:
        return bench.preemptions[run][round(rate, 4)]

    out: dict[str, Any] = {
        "goodput_ratio": ratio("a100_80gb", HEADLINE),
        "target_goodput_ratio": 2.5,
        "goodput_ratio_baseline": "fcfs = vLLM V1 (chunked prefill, 2,048-token budget, recompute "
        "preemption), the scheduler of the vLLM the project ships; fcfs_v0 = paper-era vLLM V0, "
        "reported in goodput_ratio_vs_vllm_v0",
        "goodput_ratio_vs_vllm_v0": ratio("a100_80gb", HEADLINE, "fcfs_v0"),
        **{
            f"goodput_ratio_{slo}_slo{sfx}": ratio("a100_80gb", slo, base)
            for slo in SLOS
            if slo != HEADLINE
            for base, sfx in (("fcfs", ""), ("fcfs_v0", "_vs_vllm_v0"))
        },
        "goodput_ratio_a100_40gb": ratio("a100_40gb", HEADLINE),
        "goodput_ratio_a100_40gb_vs_vllm_v0": ratio("a100_40gb", HEADLINE, "fcfs_v0"),
        # References (headline SLO, 80 GB) over FCFS V1: what perfect length prediction, and
        # clairvoyant shedding on top of it, would give.
        **{
            f"goodput_ratio_{v}": goodputs[f"a100_80gb/{HEADLINE}/{v}"]
            / goodputs[f"a100_80gb/{HEADLINE}/fcfs"]
            for v in references
        },
        "clairvoyant_shed_fraction_by_rate": {str(r): f for r, f in sorted(bench.shed.items())},
        "goodput_gpu_work_bound": work_bound,
        "goodput_ratio_gpu_work_bound": work_bound / goodputs[f"a100_80gb/{HEADLINE}/fcfs"],
        **{f"goodput_{key(k)}": g for k, g in goodputs.items()},
        "fixed_rate": args.fixed_rate,
        "overload_rate": args.overload_rate,
        "fixed_and_overload_rate_a100_40gb": list(rates["a100_40gb"]),
        **{f"attainment_{key(k)}_at_fixed_rate": a for k, a in fixed.items()},
        **{f"attainment_{key(k)}_at_overload_rate": a for k, a in over.items()},
        **{f"preemptions_{key(k)}_at_overload_rate": pre(k, rates[k.split("/")[0]][1]) for k in runs},
        "setup_notes": SETUP_NOTES,
        "slos": {k: slo_json(v) for k, v in SLOS.items()},
        "target_attainment": 0.9,
        "headline_slo": HEADLINE,
        "hardware": f"{MODEL}@{GPU}",
        "kv_tokens": KV_TOKENS,
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
        "load_average": list(os.getloadavg()),
        "wall_seconds": time.perf_counter() - t0,
    }
    write_json_atomic(args.out, out)
    html = args.html
    write_html(html, bench.curves, goodputs)
    for k in goodputs:
        print(f"{k:>40}: goodput {goodputs[k]:.2f} req/s, attainment {fixed[k]:.3f} / {over[k]:.3f}")
    print(
        f"goodput_ratio (EcoServe / FCFS V1, {HEADLINE} SLO) = {out['goodput_ratio']:.2f}",
        f"(target >= 2.5); vs vLLM V0 {out['goodput_ratio_vs_vllm_v0']:.2f};",
        f"feasible SLO {out['goodput_ratio_feasible_slo']:.2f};",
        f"chatbot SLO {out['goodput_ratio_chatbot_slo']:.2f};",
        f"A100-40GB {out['goodput_ratio_a100_40gb']:.2f};",
        f"references: true lengths {out['goodput_ratio_ecoserve_true_lengths']:.2f},",
        f"clairvoyant shedding {out['goodput_ratio_clairvoyant_shed']:.2f};",
        f"bound from GPU work alone {out['goodput_ratio_gpu_work_bound']:.2f}",
    )
    print(
        f"predictor: MAE {report.mae:.1f} tokens vs {report.mean_baseline_mae:.1f} predicting the mean; "
        f"bucket accuracy {report.bucket_accuracy:.2f}"
    )
    print(f"wrote {args.out} and {html} in {out['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
