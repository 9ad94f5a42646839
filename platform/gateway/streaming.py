"""Relaying an engine's SSE stream: event framing, usage extraction, per-token timing.

The gateway asks the engine for ``stream_options: {include_usage, continuous_usage_stats}`` so
that every chunk carries the running token counts: usage is known even when the client leaves
mid-stream. A chunk's counts are its choice's alone (vLLM counts each of the request's ``n``
choices, and each prompt of a legacy completion, on its own), so the meter keeps every choice's
latest counts and adds them up until the engine's final usage chunk gives the totals. Chunks are
rewritten to what the client asked for: ``usage`` is removed (or ``null`` when the client asked
for ``include_usage``, kept when it also asked for ``continuous_usage_stats``), and the engine's
final usage chunk is passed on only when the client asked for it. An error event (vLLM sends
``data: {"error": {...}}`` then ``[DONE]`` when generation fails) is rewritten to the gateway's
error shape.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import engine_error

DONE = b"[DONE]"


def upstream_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The body sent to the engine: the client's, with usage on every chunk of a stream."""
    if not stream:
        return body
    return {**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@dataclass
class StreamMeter:
    """Timing and token counts of one response, fed event by event.

    ``started`` is the request's arrival at the gateway (``time.monotonic()``); the first event
    that carries generated text sets TTFT, later ones add time-between-token gaps. ``done`` is set
    by the stream's closing ``[DONE]`` event, ``failed`` by an error event from the engine.
    """

    started: float
    include_usage: bool = False
    continuous_usage: bool = False  # the client's chunks keep the engine's running usage
    choices_per_prompt: int = 1  # the request's ``n``: choice ``i`` is prompt ``i // n``'s
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    done: bool = False
    failed: bool = False
    _buffer: bytes = b""
    _choices: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (prompt, completion)

    def feed(self, data: bytes) -> list[bytes]:
        """Bytes from the engine -> complete SSE events to send to the client, rewritten."""
        self._buffer += data
        out: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return out
            event, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            rewritten = self._event(event)
            if rewritten is not None:
                out.append(rewritten + b"\n\n")

    def _event(self, event: bytes) -> bytes | None:
        event = event.strip(b"\r")
        if not event.startswith(b"data:"):
            return event  # comments, other fields: pass through
        payload = event[5:].strip()
        if payload == DONE:
            self.done = True
            return b"data: [DONE]"
        try:
            chunk = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(chunk, dict):
            return event
        error = chunk.get("error")
        if isinstance(error, dict):
            self.failed = True
            code = error.get("code")
            status = code if isinstance(code, int) and code >= 400 else 500
            return b"data: " + engine_error(status, chunk).body()
        choices = chunk.get("choices")
        if not choices and chunk.get("usage") is not None:
            # The engine's final usage-only chunk: the whole request's.
            self._take_usage(chunk.get("usage"))
            return b"data: " + _dump(chunk) if self.include_usage else None
        if isinstance(choices, list):
            self._take_choice_usage(choices, chunk.get("usage"))
        if isinstance(choices, list) and any(_has_text(c) for c in choices):
            self._token(time.monotonic())
        if not self.include_usage:
            chunk.pop("usage", None)
        elif not self.continuous_usage:
            chunk["usage"] = None
        return b"data: " + _dump(chunk)

    def _take_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)

    def _take_choice_usage(self, choices: list[Any], usage: Any) -> None:
        """A chunk's running counts, which are its choice's alone: the request's are the sum over
        its choices (prompts counted once per prompt, ``choices_per_prompt`` choices each)."""
        if not isinstance(usage, dict):
            return
        counts = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            self._choices[index if isinstance(index, int) else 0] = counts
        prompts = {i // self.choices_per_prompt: prompt for i, (prompt, _) in self._choices.items()}
        self.prompt_tokens = sum(prompts.values())
        self.completion_tokens = sum(completion for _, completion in self._choices.values())

    def _token(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
        self.last_token_at = now

    def take_response(self, body: dict[str, Any]) -> None:
        """A whole (non-streamed) response: its usage (no token timing: it arrives all at once)."""
        self._take_usage(body.get("usage"))

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def tbt_mean_s(self) -> float | None:
        return sum(self.gaps) / len(self.gaps) if self.gaps else None

    @property
    def tbt_max_s(self) -> float | None:
        return max(self.gaps) if self.gaps else None


def _has_text(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    return bool(choice.get("text"))


def _dump(chunk: dict[str, Any]) -> bytes:
    return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
