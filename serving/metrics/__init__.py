"""Latency and SLO metrics over request records."""

from serving.metrics.records import RequestRecord

__all__ = ["RequestRecord"]
