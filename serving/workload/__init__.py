"""Request workloads: arrival processes, length distributions and trace replay."""

from serving.workload.request import Request

__all__ = ["Request"]
