"""The unit of work every generator produces and the simulator consumes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request of a workload.

    Attributes:
        req_id: Unique, dense id within a workload (0, 1, 2, ...); ties are broken by it.
        arrival: Arrival time in seconds from the start of the workload.
        prompt_tokens: Number of prompt (input) tokens, >= 1.
        output_tokens: Number of tokens to generate, >= 1.
        slo_class: Optional SLO class name (e.g. "interactive"); None means the model's default SLO.
    """

    req_id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    slo_class: str | None = None

    def __post_init__(self) -> None:
        if self.arrival < 0:
            raise ValueError(f"{self.arrival=} must be >= 0")
        if self.prompt_tokens < 1:
            raise ValueError(f"{self.prompt_tokens=} must be >= 1")
        if self.output_tokens < 1:
            raise ValueError(f"{self.output_tokens=} must be >= 1")
