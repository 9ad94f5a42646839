"""One flat dictionary of a run's headline figures, as written to summary.json."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from serving.metrics.latency import e2e_latencies, percentile, tbts, tpots, ttfts
from serving.metrics.records import RequestRecord
from serving.metrics.slo import SLO, attainment

SUMMARY_KEYS: tuple[str, ...] = (
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "ttft_mean",
    "tbt_p50",
    "tbt_p99",
    "tpot_p50",
    "tpot_p99",
    "e2e_p50",
    "e2e_p99",
    "throughput_tokens_per_s",
    "requests",
    "finished",
    "preemptions",
    "bytes_moved",
    "attainment",
)


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo: SLO | Mapping[str | None, SLO] | None = None,
) -> dict[str, float]:
    """Headline latency, throughput and SLO figures of one run.

    Args:
        records: Every request of the run (finished or not).
        duration_s: Wall time the run is measured over (s); throughput is every emitted output
            token divided by it.
        slo: The SLO (or per-class mapping) for `attainment`; None leaves it nan.

    Returns:
        A dict with exactly `SUMMARY_KEYS`. Latency keys are seconds (nan when there is no sample);
        counts are floats so the dict is uniformly typed.

    Raises:
        ValueError: duration_s not positive and finite.
    """
    if not 0 < duration_s < math.inf:  # an infinite window reported 0 tokens/s, whatever was emitted
        raise ValueError(f"{duration_s=} must be positive and finite")
    ttft = ttfts(records)
    tbt = tbts(records)
    tpot = tpots(records)
    e2e = e2e_latencies(records)
    out = {
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "ttft_mean": _mean(ttft),
        "tbt_p50": percentile(tbt, 50),
        "tbt_p99": percentile(tbt, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
        "e2e_p50": percentile(e2e, 50),
        "e2e_p99": percentile(e2e, 99),
        "throughput_tokens_per_s": sum(len(r.token_times) for r in records) / duration_s,
        "requests": float(len(records)),
        "finished": float(sum(r.finished for r in records)),
        "preemptions": float(sum(r.preemptions for r in records)),
        "bytes_moved": float(sum(r.bytes_moved for r in records)),
        "attainment": attainment(records, slo) if slo is not None else math.nan,
    }
    assert tuple(out) == SUMMARY_KEYS
    return out
