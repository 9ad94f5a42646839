"""Iteration latency in the form of DistServe's simulator.

prefill(chunks)   = a + b * sum(l) + c * sum(l^2)      over the prefill chunk lengths l
decode(contexts)  = a + b * sum(ctx) + c * batch_size  over the decoding requests' context lengths

A mixed (chunked-prefill) iteration runs both parts in one forward pass; its fixed overhead is paid
once, so it costs prefill + decode - min(a_prefill, a_decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PhaseCoeffs:
    """Coefficients (seconds) of one phase's latency formula; see the module docstring."""

    a: float
    b: float
    c: float


@dataclass(frozen=True, slots=True)
class CostModel:
    """Latency of one engine iteration from its batch composition.

    Attributes:
        prefill: Coefficients of the prefill formula.
        decode: Coefficients of the decode formula.
        kv_bytes_per_token: KV-cache bytes one token occupies across all layers (K and V).
        name: Human-readable label, e.g. "llama-3-8b@h100".
    """

    prefill: PhaseCoeffs
    decode: PhaseCoeffs
    kv_bytes_per_token: int
    name: str = "custom"

    def prefill_time(self, chunk_lens: Sequence[int]) -> float:
        if not chunk_lens:
            return 0.0
        p = self.prefill
        return p.a + p.b * sum(chunk_lens) + p.c * sum(n * n for n in chunk_lens)

    def decode_time(self, context_lens: Sequence[int]) -> float:
        if not context_lens:
            return 0.0
        d = self.decode
        return d.a + d.b * sum(context_lens) + d.c * len(context_lens)

    def iteration_time(self, prefill_chunks: Sequence[int], decode_contexts: Sequence[int]) -> float:
        """Seconds for one forward pass over the given prefill chunks and decoding requests."""
        t = self.prefill_time(prefill_chunks) + self.decode_time(decode_contexts)
        if prefill_chunks and decode_contexts:
            t -= min(self.prefill.a, self.decode.a)
        return t
