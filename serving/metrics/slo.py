"""Service-level objectives and per-request attainment.

A request attains its SLO only if it finished (emitted every token it asked for) AND its TTFT is
within `ttft_s` AND its token pacing is within `tbt_s`, measured one of three ways:
  "tpot"     (last - first) / (n - 1), DistServe's TPOT (the default);
  "p99_tbt"  the 99th percentile of the request's own inter-token gaps (linear interpolation);
  "max_tbt"  the largest inter-token gap (the strictest: one stall fails the request).
A request with a single output token has no gaps and meets any pacing target.
Comparisons are inclusive: a value equal to its target attains.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from serving.metrics.latency import percentile, tpot
from serving.metrics.records import RequestRecord

TbtKind = Literal["p99_tbt", "max_tbt", "tpot"]
TBT_KINDS: tuple[str, ...] = get_args(TbtKind)


@dataclass(frozen=True)
class SLO:
    """Latency targets of one SLO class.

    Attributes:
        ttft_s: Max time to first token (s).
        tbt_s: Max token pacing (s), measured as `tbt_kind` says.
        tbt_kind: How a request's pacing is measured: "tpot", "p99_tbt" or "max_tbt".
    """

    ttft_s: float
    tbt_s: float
    tbt_kind: TbtKind = "tpot"

    def __post_init__(self) -> None:
        if not self.ttft_s > 0 or math.isinf(self.ttft_s):
            raise ValueError(f"{self.ttft_s=} must be a positive finite number")
        if not self.tbt_s > 0 or math.isinf(self.tbt_s):
            raise ValueError(f"{self.tbt_s=} must be a positive finite number")
        if self.tbt_kind not in TBT_KINDS:
            raise ValueError(f"{self.tbt_kind=} must be one of {', '.join(TBT_KINDS)}")


def pacing(record: RequestRecord, kind: TbtKind) -> float | None:
    """The record's token pacing measured as `kind`; None if it has fewer than two tokens."""
    t = record.token_times
    if len(t) < 2:
        return None
    if kind == "tpot":
        return tpot(record)
    gaps = [t[i] - t[i - 1] for i in range(1, len(t))]
    if kind == "max_tbt":
        return max(gaps)
    return percentile(gaps, 99.0)


def attains(record: RequestRecord, slo: SLO) -> bool:
    """Whether the record finished and met both its TTFT and its pacing target."""
    if not record.finished or not record.token_times:
        return False
    ttft = record.token_times[0] - record.arrival
    if ttft > slo.ttft_s:
        return False
    p = pacing(record, slo.tbt_kind)
    return p is None or p <= slo.tbt_s


def slo_for(record: RequestRecord, slo: SLO | Mapping[str | None, SLO]) -> SLO:
    """The SLO that applies to a record: its class's entry, else the None (default) entry.

    Raises:
        ValueError: A mapping with neither the record's class nor a None entry.
    """
    if isinstance(slo, SLO):
        return slo
    if record.slo_class in slo:
        return slo[record.slo_class]
    if None in slo:
        return slo[None]
    known = ", ".join(sorted(repr(k) for k in slo))
    raise ValueError(f"no SLO for class {record.slo_class!r} and no default (None) entry; have {known}")


def attainment(records: Iterable[RequestRecord], slo: SLO | Mapping[str | None, SLO]) -> float:
    """Fraction of records that attain their SLO.

    Args:
        records: The run's records; every request of the workload should be present, including
            those that never produced a token (they count as misses).
        slo: One SLO for all, or a mapping slo_class -> SLO where the None key is the default.

    Returns:
        A fraction in [0, 1]; nan when there are no records.
    """
    total = 0
    met = 0
    for r in records:
        total += 1
        met += attains(r, slo_for(r, slo))
    return met / total if total else math.nan
