"""The profiling frames of the agent protocol (gpu_agent/protocol.py, PROTOCOL.md): the control
plane's `probe` (replay a workload against a deployment's engine at one rate) and the agent's
`probe_result` (what the replay saw). gpu_agent/probe.py runs them; planning.engine_probe sends them.
Standard library only, like the rest of the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpu_agent.schema import Frame, Sender, check, non_negative


@dataclass(frozen=True, slots=True)
class ProbeRequestSpec:
    """One request of a replayed workload: sent `arrival_s` after the replay starts, with a prompt
    of `prompt_tokens` tokens, generating exactly `max_tokens` tokens (EOS ignored)."""

    arrival_s: float
    prompt_tokens: int
    max_tokens: int

    def __post_init__(self) -> None:
        non_negative(self, "arrival_s")
        check(self.prompt_tokens >= 1, "prompt_tokens", f"must be >= 1, got {self.prompt_tokens}")
        check(self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class Probe(Frame):
    """Replay `requests` against deployment `deployment_id`'s engine (streaming OpenAI completions)
    and answer with a `probe_result` carrying the same `probe_id`. Requests still running after
    `timeout_s` count as unfinished.

    With `cancel`, the frame (otherwise a copy of the one that started it) stops the replay of
    `probe_id` instead: its streams are closed, so the engine aborts their requests, and nothing
    more is sent. Both the stopped replay and the cancel frame are answered with a `probe_result`
    that is not `ok` (the control plane has stopped waiting for it)."""

    TYPE: ClassVar[str] = "probe"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("control_plane",)
    probe_id: str
    deployment_id: str
    rate: float
    requests: list[ProbeRequestSpec]
    timeout_s: float = 600.0
    seed: int = 0  # seeds the prompt token ids
    cancel: bool = False  # stop the replay of `probe_id` (see above)

    def __post_init__(self) -> None:
        check(bool(self.probe_id), "probe_id", "must not be empty")
        check(self.rate > 0, "rate", f"must be > 0, got {self.rate}")
        check(bool(self.requests), "requests", "must hold at least one request")
        check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")


@dataclass(frozen=True, slots=True)
class IterationSample:
    """One engine step as a client saw it: the batch's prompt lengths (prefill) or context lengths
    (decode), and its duration in seconds; for fitting a cost model (serving.costmodel.fit)."""

    lens: list[int]
    seconds: float

    def __post_init__(self) -> None:
        check(bool(self.lens), "lens", "must not be empty")
        check(self.seconds > 0, "seconds", f"must be > 0, got {self.seconds}")


@dataclass(frozen=True, slots=True)
class ProbeReport(Frame):
    """What a replay saw. Percentiles are seconds; null means infinitely late (more than 1% of the
    requests produced no token, or no inter-token gap was seen). KV figures are bytes; 0 when the
    engine does not expose them. `peak_kv_demand_bytes` adds, at each sample, the prompts of
    requests sent but not yet answered to the KV in use (what the engine would hold with room).
    `prefill_samples` / `decode_samples` are engine steps timed from the client side (see
    gpu_agent/probe.py). `ok` is False, with `error`, when the replay could not run at all."""

    TYPE: ClassVar[str] = "probe_result"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent",)
    probe_id: str
    deployment_id: str
    ok: bool
    error: str | None = None
    rate: float = 0.0
    num_requests: int = 0
    finished: int = 0
    ttft_p99_s: float | None = None
    tbt_p99_s: float | None = None
    ttft_p50_s: float | None = None
    tbt_p50_s: float | None = None
    kv_capacity_bytes: int = 0
    peak_kv_used_bytes: int = 0
    peak_kv_demand_bytes: int = 0
    kv_bytes_per_token: int = 0
    duration_s: float = 0.0
    prefill_samples: list[IterationSample] = field(default_factory=list)
    decode_samples: list[IterationSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        non_negative(self, "num_requests", "finished", "kv_capacity_bytes", "peak_kv_used_bytes")
        non_negative(self, "peak_kv_demand_bytes", "kv_bytes_per_token", "duration_s")
        non_negative(self, "ttft_p99_s", "tbt_p99_s", "ttft_p50_s", "tbt_p50_s")
