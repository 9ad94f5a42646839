"""Per-request simulator state; implements the policies' `SchedRequest` protocol."""

from __future__ import annotations

from serving.metrics.records import RequestRecord
from serving.workload.request import Request

# Where a request is.
WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3


class SimRequest:
    """One request inside an engine simulation.

    Token accounting mirrors vLLM V1: the request's sequence has `num_prompt_tokens +
    num_output_tokens` tokens; `computed` of them have KV in the cache. A step schedules
    `num_tokens - computed` new tokens (capped by the budget: a prefill chunk); when a step brings
    `computed` up to `num_tokens` the model samples one more output token. A decode step therefore
    schedules exactly one token (the last sampled one).

    Plain attributes rather than properties on the hot path; the protocol's read-only properties
    are satisfied by attributes the engine alone writes.
    """

    __slots__ = (
        "admission_seq",
        "arrival_time",
        "blocks",
        "computed",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "offloaded_bytes",
        "offloaded_in_peer",
        "predicted_output_tokens",
        "record",
        "req_id",
        "slo_class",
        "state",
        "target_output_tokens",
        "token_times",
    )

    def __init__(self, request: Request, predicted_output_tokens: int | None = None) -> None:
        self.req_id: int = request.req_id
        self.arrival_time: float = request.arrival
        self.num_prompt_tokens: int = request.prompt_tokens
        self.target_output_tokens: int = request.output_tokens
        self.predicted_output_tokens: int | None = predicted_output_tokens
        self.slo_class: str | None = request.slo_class
        self.num_output_tokens: int = 0
        self.computed: int = 0  # tokens whose KV is in the GPU cache (or saved, when offloaded)
        self.blocks: int = 0  # KV blocks held on the GPU
        self.admission_seq: int = -1
        self.num_preemptions: int = 0
        self.offloaded_bytes: int = 0  # > 0 while the KV lives in DRAM or peer memory
        self.offloaded_in_peer: bool = False
        self.state: int = WAITING
        self.record = RequestRecord(
            req_id=request.req_id,
            arrival=request.arrival,
            prompt_tokens=request.prompt_tokens,
            output_tokens=request.output_tokens,
            slo_class=request.slo_class,
        )
        self.token_times: list[float] = self.record.token_times  # shared list, appended in place

    @property
    def num_computed_prompt_tokens(self) -> int:
        """Prompt tokens whose KV is computed; 0 after a recompute preemption."""
        return min(self.computed, self.num_prompt_tokens)

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is computed (`computed`): what the request's blocks hold."""
        return self.computed

    @property
    def max_output_tokens(self) -> int | None:
        """Uncapped: a simulated request stops at its `target_output_tokens`, which no policy reads."""
        return None

    @property
    def num_tokens(self) -> int:
        """Length of the sequence so far: prompt plus generated tokens."""
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self) -> str:
        return (
            f"SimRequest(id={self.req_id}, out={self.num_output_tokens}/{self.target_output_tokens}, "
            f"computed={self.computed}, blocks={self.blocks})"
        )
