"""Request workloads: arrival processes, length distributions and trace replay."""

from serving.workload.arrivals import gamma_arrivals, on_off_arrivals, poisson_arrivals
from serving.workload.datasets import available_length_dists, get_length_dist, register_length_dist
from serving.workload.factory import WORKLOAD_KINDS, make_workload, requests_from_arrivals
from serving.workload.lengths import LengthDistribution, LogNormalLength
from serving.workload.request import Request
from serving.workload.trace import load_trace, write_trace

__all__ = [
    "WORKLOAD_KINDS",
    "LengthDistribution",
    "LogNormalLength",
    "Request",
    "available_length_dists",
    "gamma_arrivals",
    "get_length_dist",
    "load_trace",
    "make_workload",
    "on_off_arrivals",
    "poisson_arrivals",
    "register_length_dist",
    "requests_from_arrivals",
    "write_trace",
]
