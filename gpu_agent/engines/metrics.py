"""Reading a vLLM engine's Prometheus /metrics into the telemetry's engine figures.

Families read (summed over label sets, e.g. several model names):
  vllm:time_to_first_token_seconds  histogram -> ttft p50/p99
  vllm:inter_token_latency_seconds  histogram -> itl p50/p99
  vllm:kv_cache_usage_perc          gauge, a fraction in [0, 1] despite the name (mean over sets)
  vllm:num_requests_running/_waiting gauges
  vllm:num_preemptions              counter (exposed as ..._total)
  vllm:kv_offload_store_bytes       counter, KV bytes offloaded (present only with an offloading
                                    connector)

Quantiles follow Prometheus' histogram_quantile: find the bucket holding the rank and interpolate
linearly inside it (the lowest bucket starts at 0; a rank in the +Inf bucket returns the highest
finite bound). They are computed over a *window*: the bucket-count difference between two scrapes,
so each telemetry second reports that second's latencies, not the engine's lifetime.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpu_agent.protocol import EngineSample, LatencySummary
from gpu_agent.schema import INT64_MAX

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions"
OFFLOADED = "vllm:kv_offload_store_bytes"


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative buckets as (upper bound, count of observations <= bound), ascending; the last
    bound is +Inf and its count is the total."""

    buckets: tuple[tuple[float, float], ...]

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier` (same bucket layout). If any bucket went down
        (the engine restarted and its counters reset), the whole of `self` is the window."""
        if earlier is None or [b for b, _ in earlier.buckets] != [b for b, _ in self.buckets]:
            return self
        deltas = tuple((b, c - e) for (b, c), (_, e) in zip(self.buckets, earlier.buckets, strict=True))
        if any(d < 0 for _, d in deltas):
            return self
        return Histogram(deltas)

    def plus(self, other: Histogram) -> Histogram | None:
        """The observations of both windows; None when their bucket layouts differ."""
        if [b for b, _ in other.buckets] != [b for b, _ in self.buckets]:
            return None
        return Histogram(
            tuple((b, c + o) for (b, c), (_, o) in zip(self.buckets, other.buckets, strict=True))
        )


Window = dict[str, Histogram]  # latency histogram name -> the observations of a window


def combine(first: Window, then: Window) -> list[Window]:
    """The observations of both windows as one, `[first + then]`; `[first, then]` when a
    histogram's bucket layouts differ (an engine restarted with other buckets), to be reported
    apart, in that order."""
    out = dict(first)
    for name, hist in then.items():
        both = out[name].plus(hist) if name in out else hist
        if both is None:
            return [first, then]
        out[name] = both
    return [out]


def histogram_quantile(q: float, hist: Histogram) -> float | None:
    """The q-quantile (0 <= q <= 1) estimated from cumulative buckets; None with no observations."""
    if not 0 <= q <= 1:
        raise ValueError(f"{q=} must be in [0, 1]")
    total = hist.count
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in hist.buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def summarize(hist: Histogram | None) -> LatencySummary | None:
    """p50/p99 of a window; None when the engine exposes no such histogram."""
    if hist is None:
        return None
    n = round(hist.count)
    if n <= 0:
        return LatencySummary(count=0)
    return LatencySummary(count=n, p50=histogram_quantile(0.5, hist), p99=histogram_quantile(0.99, hist))


@dataclass(slots=True)
class EngineMetrics:
    """One scrape. Histograms are cumulative (since the engine started)."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    kv_cache_usage: float | None = None
    running: int = 0
    waiting: int = 0
    preemptions_total: int = 0
    bytes_offloaded: int = 0


def since(current: EngineMetrics, earlier: EngineMetrics | None) -> Window:
    """The latency observations between two scrapes of one run (since its start without `earlier`)."""
    return {
        name: hist.minus(earlier.histograms.get(name) if earlier is not None else None)
        for name in (TTFT, ITL)
        if (hist := current.histograms.get(name)) is not None
    }


def with_latencies(sample: EngineSample, window: Window) -> EngineSample:
    """`sample` with p50/p99 of `window` (None for a histogram the engine does not expose)."""
    return dataclasses.replace(sample, ttft=summarize(window.get(TTFT)), itl=summarize(window.get(ITL)))


def _finite(sample: Sample) -> float:
    """A sample's value; ValueError naming the sample when it is no finite number (NaN, +Inf),
    which no count, gauge or frame field can be."""
    value = float(sample.value)
    if not math.isfinite(value):
        raise ValueError(f"{sample.name} is {value!r}, not a finite number")
    return value


def _bound(sample: Sample) -> float:
    """A histogram bucket's upper bound (its `le` label; +Inf allowed); ValueError naming the
    sample when it has none or it is not a number."""
    le = sample.labels.get("le")
    bound = float("nan") if le is None else float(le)
    if math.isnan(bound):
        raise ValueError(f"{sample.name} has no bucket bound (le={le!r})")
    return bound


def parse_metrics(text: str) -> EngineMetrics:
    """Parse Prometheus text exposition from a vLLM server's /metrics.

    Raises:
        ValueError: the text is not Prometheus', or a sample read holds no finite number (a
            histogram bucket without `le`, a NaN or +Inf value), naming it.
    """
    out = EngineMetrics()
    kv: list[float] = []
    for family in text_string_to_metric_families(text):
        name = family.name
        if name in (TTFT, ITL):
            buckets: dict[float, float] = {}
            for s in family.samples:
                if s.name == f"{name}_bucket":
                    bound = _bound(s)
                    buckets[bound] = buckets.get(bound, 0.0) + _finite(s)
            if buckets:
                out.histograms[name] = Histogram(tuple(sorted(buckets.items())))
        elif name == KV_USAGE:
            kv.extend(_finite(s) for s in family.samples)
        elif name in (RUNNING, WAITING, PREEMPTIONS, OFFLOADED):
            total = sum(_finite(s) for s in family.samples if s.name in (name, f"{name}_total"))
            value = max(0, round(total))
            if name == RUNNING:
                out.running = value
            elif name == WAITING:
                out.waiting = value
            elif name == PREEMPTIONS:
                out.preemptions_total = value
            else:
                out.bytes_offloaded = value
    if kv:
        out.kv_cache_usage = min(1.0, max(0.0, sum(kv) / len(kv)))
    return out


def connector_bytes(path: str) -> int:
    """`bytes_offloaded` of the Aqua connector's counters file at `path` (JSON); 0 while the file
    is missing or half-written (the next scrape reads it) or holds no mapping.

    Raises:
        ValueError: the value is no count the control plane stores (a signed 64-bit integer,
            >= 0; `true`, a bool, is no count), naming the file and the value.
    """
    try:
        with open(path, encoding="utf-8") as f:
            counters = json.load(f)
    except (OSError, ValueError):
        return 0
    value = counters.get("bytes_offloaded", 0) if isinstance(counters, dict) else 0
    if type(value) is int and 0 <= value <= INT64_MAX:  # (type(True) is bool, not int)
        return value
    what = f"bytes_offloaded={value!r:.60}"
    raise ValueError(f"the Aqua connector's counters file {path} holds {what}, not a count in 0..2**63-1")
