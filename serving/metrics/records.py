"""Per-request results, the common currency of the simulator, the benchmarks and the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request.

    Attributes:
        req_id: The workload request id.
        arrival: Arrival time (s).
        prompt_tokens: Prompt length.
        output_tokens: Number of tokens the request asked for.
        token_times: Emission time (s) of every generated token, in order; token_times[0] is the
            first token. Shorter than output_tokens if the run ended first.
        preemptions: How many times the request was preempted.
        bytes_moved: KV bytes saved and restored for this request (offload modes).
        recomputed_tokens: Tokens whose KV was computed again after a preemption.
        slo_class: The request's SLO class, if any.
    """

    req_id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    bytes_moved: int = 0
    recomputed_tokens: int = 0
    slo_class: str | None = None

    @property
    def finished(self) -> bool:
        return len(self.token_times) >= self.output_tokens

    @property
    def ttft(self) -> float | None:
        """Time to first token (s), None if no token was produced."""
        return self.token_times[0] - self.arrival if self.token_times else None
