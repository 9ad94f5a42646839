"""Fidelity check of the DistServe benchmark against the paper's own Fig. 1 measurements.

DistServe (OSDI'24, Sec. 2.3, Fig. 1; 13B model, 512 in / 64 out, one A100, TTFT 0.4 s, TPOT 0.04 s
at P90) measures 5.6 rps on a prefill-only GPU, 10 rps on a decode-only GPU, ~1.6 rps for vLLM
serving both phases on one GPU, and 10 rps on 2 prefill + 1 decode GPUs (3.3 rps per GPU, 2.1x).

The derived llama-2-13b@a100 cost model is faster than the system the paper measured (its
single-phase goodputs are well above 5.6 and 10 rps). This check asks whether the simulator's
colocation and disaggregation behave like the paper's once the per-phase speed matches: it slows
the prefill coefficients by one factor and the decode coefficients by another, each chosen so that
the single-phase goodputs reproduce the paper's 5.6 and 10 rps (the two calibration inputs), and
then PREDICTS the two figures not used for calibration: the colocated vLLM goodput (paper ~1.6) and
the 2 prefill + 1 decode goodput per GPU (paper 3.3). It does not change the benchmark's headline
figures, which use the derived cost model as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from serving.costmodel import CostModel, Link, PhaseCoeffs
from serving.distserve import Handoff, LaneModel, run_vllm_v0
from serving.distserve.disagg import run_decode, run_prefill
from serving.metrics import SLO, attainment, goodput
from serving.metrics.latency import tpot
from serving.metrics.records import RequestRecord
from serving.workload.request import Request

Workload = Callable[[float], list[Request]]  # rate (req/s) -> requests

PAPER = {"prefill_only_rps": 5.6, "decode_only_rps": 10.0, "colocated_vllm_rps": 1.6, "per_gpu_2p1d_rps": 3.3}


def scaled(cost: CostModel, prefill: float, decode: float) -> CostModel:
    """`cost` with every prefill coefficient times `prefill` and every decode one times `decode`."""
    p, d = cost.prefill, cost.decode
    return CostModel(
        PhaseCoeffs(p.a * prefill, p.b * prefill, p.c * prefill),
        PhaseCoeffs(d.a * decode, d.b * decode, d.c * decode),
        cost.kv_bytes_per_token,
        f"{cost.name} (prefill x{prefill:.3f}, decode x{decode:.3f})",
    )


def _rate(att: Callable[[float], float]) -> float:
    return goodput(att, 0.9, lo=1.0, hi=16.0, rel_tol=0.01)


def prefill_only(cost: CostModel, kv: int, workload: Workload, ttft_s: float) -> float:
    """Goodput of one prefill-only GPU (TTFT only; 1024-token prefill batches as DistServe's)."""

    def att(rate: float) -> float:
        recs = run_prefill(workload(rate), LaneModel(cost, 1, kv), 1, 1024)
        return sum(1 for r in recs if r.token_times[0] - r.arrival <= ttft_s) / len(recs)

    return _rate(att)


def decode_only(cost: CostModel, kv: int, workload: Workload, tpot_s: float, link: Link) -> float:
    """Goodput of one decode-only GPU (TPOT only), KV pulled over `link`."""

    def att(rate: float) -> float:
        recs = [
            RequestRecord(r.req_id, r.arrival, r.prompt_tokens, r.output_tokens, [r.arrival])
            for r in workload(rate)
        ]
        run_decode([Handoff(r.arrival, r) for r in recs], LaneModel(cost, 1, kv), 1, link)
        return sum(1 for r in recs if (tpot(r) or 0.0) <= tpot_s) / len(recs)

    return _rate(att)


def _factor(measure: Callable[[float], float], target: float) -> float:
    """The slowdown factor (>= 1) at which `measure` (decreasing in it) comes down to `target`."""
    lo, hi = 1.0, 2.0
    while measure(hi) > target:
        lo, hi = hi, hi * 2
    while hi - lo > 0.005 * lo:
        mid = (lo + hi) / 2
        if measure(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paper_calibrated(cost: CostModel, kv: int, workload: Workload, slo: SLO, link: Link) -> dict[str, float]:
    """Calibrate the two slowdowns to the paper's single-phase goodputs; predict the other two."""
    f_p = _factor(
        lambda f: prefill_only(scaled(cost, f, 1.0), kv, workload, slo.ttft_s), PAPER["prefill_only_rps"]
    )
    f_d = _factor(
        lambda f: decode_only(scaled(cost, 1.0, f), kv, workload, slo.tbt_s, link), PAPER["decode_only_rps"]
    )
    cal = scaled(cost, f_p, f_d)
    g_p = prefill_only(cal, kv, workload, slo.ttft_s)
    g_d = decode_only(cal, kv, workload, slo.tbt_s, link)

    def colocated(rate: float) -> list[RequestRecord]:
        return run_vllm_v0(workload(rate), LaneModel(cal, 1, kv))

    def two_one(rate: float) -> list[RequestRecord]:
        lane = LaneModel(cal, 1, kv)
        recs = run_prefill(workload(rate), lane, 2, 1024)
        run_decode([Handoff(r.token_times[0], r) for r in recs], lane, 1, link)
        return recs

    coloc = _rate(lambda r: attainment(colocated(r), slo))
    per_gpu_2p1d = _rate(lambda r: attainment(two_one(r), slo)) / 3  # the unit's goodput per GPU
    # Fig. 1's own reading: the P90 TTFT and the P90 TPOT curves each under their SLO.
    coloc_p90 = _rate(lambda r: p90_reading(colocated(r), slo))
    per_gpu_2p1d_p90 = _rate(lambda r: p90_reading(two_one(r), slo)) / 3
    return {
        "uncalibrated_prefill_only_rps": prefill_only(cost, kv, workload, slo.ttft_s),
        "uncalibrated_decode_only_rps": decode_only(cost, kv, workload, slo.tbt_s, link),
        "prefill_slowdown": f_p,
        "decode_slowdown": f_d,
        "calibrated_prefill_only_rps": g_p,
        "calibrated_decode_only_rps": g_d,
        "predicted_colocated_vllm_rps": coloc,
        "predicted_per_gpu_2p1d_rps": per_gpu_2p1d,
        "predicted_ratio": per_gpu_2p1d / coloc if coloc else float("inf"),
        "predicted_colocated_vllm_rps_p90_reading": coloc_p90,
        "predicted_per_gpu_2p1d_rps_p90_reading": per_gpu_2p1d_p90,
        "predicted_ratio_p90_reading": per_gpu_2p1d_p90 / coloc_p90 if coloc_p90 else float("inf"),
    }


def p90_reading(records: list[RequestRecord], slo: SLO) -> float:
    """The smaller of the fractions meeting the TTFT SLO and meeting the TPOT SLO (each alone):
    >= 0.9 exactly when both P90 latencies are within their SLOs, as Fig. 1 reads them."""
    n = len(records)
    ttft_ok = sum(1 for r in records if r.ttft is not None and r.ttft <= slo.ttft_s)
    tpot_ok = sum(1 for r in records if r.finished and (tpot(r) or 0.0) <= slo.tbt_s)
    return min(ttft_ok, tpot_ok) / n if n else 1.0
