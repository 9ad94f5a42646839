"""The unit of work every generator produces and the simulator consumes."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request of a workload.

    Attributes:
        req_id: Unique, dense id within a workload (0, 1, 2, ...); ties are broken by it.
        arrival: Arrival time in seconds from the start of the workload, finite and >= 0.
        prompt_tokens: Number of prompt (input) tokens, finite and >= 1.
        output_tokens: Number of tokens to generate, finite and >= 1.
        slo_class: Optional SLO class name (e.g. "interactive"); None means the model's default SLO.
    """

    req_id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    slo_class: str | None = None

    def __post_init__(self) -> None:
        # Written so that NaN fails too (every comparison with NaN is false): a NaN arrival passed
        # `arrival < 0` and an infinite one was never reached by any run.
        if not (0 <= self.arrival < math.inf):
            raise ValueError(f"{self.arrival=} must be finite and >= 0")
        if not (1 <= self.prompt_tokens < math.inf):
            raise ValueError(f"{self.prompt_tokens=} must be finite and >= 1")
        if not (1 <= self.output_tokens < math.inf):
            raise ValueError(f"{self.output_tokens=} must be finite and >= 1")
