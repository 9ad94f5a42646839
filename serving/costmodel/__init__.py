"""Per-iteration latency, KV sizes and transfer costs."""

from serving.costmodel.model import CostModel, PhaseCoeffs

__all__ = ["CostModel", "PhaseCoeffs"]
