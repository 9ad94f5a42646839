"""A vLLM `Request` seen through the policy's `SchedRequest` protocol (read-only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.request import Request


class VllmRequestView:
    """Adapter: exposes what a `SchedulingPolicy` may read about a vLLM request.

    Args:
        request: The engine's request object (read, never modified).
        admission_seq: Sequence number of its latest admission to the running set (kept by the
            scheduler, since vLLM does not number admissions).
    """

    __slots__ = ("_r", "admission_seq")

    def __init__(self, request: Request, admission_seq: int) -> None:
        self._r = request
        self.admission_seq = admission_seq

    @property
    def request(self) -> Request:
        return self._r

    @property
    def req_id(self) -> str:
        return self._r.request_id

    @property
    def arrival_time(self) -> float:
        return float(self._r.arrival_time)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._r.num_prompt_tokens)

    @property
    def num_computed_prompt_tokens(self) -> int:
        return min(int(self._r.num_computed_tokens), int(self._r.num_prompt_tokens))

    @property
    def num_output_tokens(self) -> int:
        return int(self._r.num_output_tokens)

    @property
    def num_preemptions(self) -> int:
        return int(self._r.num_preemptions)

    @property
    def predicted_output_tokens(self) -> int | None:
        return None

    @property
    def slo_class(self) -> str | None:
        # vLLM requests carry no SLO; one could travel in SamplingParams.extra_args.
        return None
