"""Latency and SLO metrics over request records."""

from serving.metrics.goodput import goodput
from serving.metrics.latency import e2e_latencies, percentile, tbts, tpot, tpots, ttfts
from serving.metrics.records import RequestRecord
from serving.metrics.slo import SLO, attainment, attains
from serving.metrics.summary import SUMMARY_KEYS, summarize

__all__ = [
    "SLO",
    "SUMMARY_KEYS",
    "RequestRecord",
    "attainment",
    "attains",
    "e2e_latencies",
    "goodput",
    "percentile",
    "summarize",
    "tbts",
    "tpot",
    "tpots",
    "ttfts",
]
