"""Per-token and per-request latencies extracted from `RequestRecord`s.

Definitions (all in seconds, all records in the order given, tokens in emission order):
  TTFT  first token time - arrival, for every record that produced a token;
  TBT   every gap between consecutive tokens of every request (the "inter-token latency" vLLM
        reports), so a request with n tokens contributes n - 1 values;
  TPOT  per request with n >= 2 tokens: (last token - first token) / (n - 1), the mean time per
        output token after the first (DistServe's TPOT);
  E2E   last token time - arrival, for finished records only (an unfinished request has no end).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from serving.metrics.records import RequestRecord


def ttfts(records: Iterable[RequestRecord]) -> list[float]:
    """Time to first token of every record that produced at least one token."""
    return [r.token_times[0] - r.arrival for r in records if r.token_times]


def tbts(records: Iterable[RequestRecord]) -> list[float]:
    """All gaps between consecutive tokens of all requests, request by request."""
    out: list[float] = []
    for r in records:
        t = r.token_times
        out.extend(t[i] - t[i - 1] for i in range(1, len(t)))
    return out


def tpot(record: RequestRecord) -> float | None:
    """(last - first) / (n - 1) for a record with n >= 2 tokens, else None."""
    t = record.token_times
    if len(t) < 2:
        return None
    return (t[-1] - t[0]) / (len(t) - 1)


def tpots(records: Iterable[RequestRecord]) -> list[float]:
    """TPOT of every record with at least two tokens."""
    out: list[float] = []
    for r in records:
        v = tpot(r)
        if v is not None:
            out.append(v)
    return out


def e2e_latencies(records: Iterable[RequestRecord]) -> list[float]:
    """Last token time - arrival of every finished record."""
    return [r.token_times[-1] - r.arrival for r in records if r.finished and r.token_times]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]) with linear interpolation (numpy's default).

    Returns:
        nan for an empty sequence.

    Raises:
        ValueError: q outside [0, 100].
    """
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"{q=} must be in [0, 100]")
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q, method="linear"))
