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
error shape; the client's stream has no event after it but ``[DONE]`` (one error, its last event).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from core import strict_json as strict
from gateway.errors import engine_error, error_status
from gateway.unstreamed import as_stream

DONE = b"[DONE]"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark: SSE ignores one at the stream's start
# The most tokens one request is booked with: RequestSample's PositiveIntegerField (PostgreSQL
# refuses a larger integer where SQLite stores it). A count an engine reports is taken only when
# it is a non-negative integer up to this; sums over choices are clamped to it.
MAX_TOKENS = 2**31 - 1


def token_count(value: Any) -> int | None:
    """``value`` as an engine's token count, None unless a non-negative int within MAX_TOKENS:
    a misbehaving engine's strings, floats, negative or huge numbers must not reach the columns."""
    return value if type(value) is int and 0 <= value <= MAX_TOKENS else None


def strict_json(payload: bytes) -> Any:
    """``payload`` decoded as strict JSON in UTF-8 (core.strict_json: no NaN, Infinity or 1e400,
    which no client parses); raises ValueError (UnicodeDecodeError included) or RecursionError for
    anything else."""
    return strict.loads(payload)


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
    ``too_large`` by an event longer than ``max_event_bytes`` (None: no limit): the meter holds
    at most that much of one event, then stops taking the stream (the proxy cuts it off).
    """

    started: float
    include_usage: bool = False
    continuous_usage: bool = False  # the client's chunks keep the engine's running usage
    choices_per_prompt: int = 1  # the request's ``n``: choice ``i`` is prompt ``i // n``'s
    max_event_bytes: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    texts: int = 0  # choices with text (chunks, or a whole answer's): at least a token each
    reported: bool = False  # the engine reported a (valid) completion count
    done: bool = False
    failed: bool = False
    too_large: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _scanned: int = 0  # how much of _buffer is known to hold no event end
    _after_cr: bool = False  # the last piece ended in CR: an LF starting the next ends that line
    _at_start: bool = True  # the stream's first bytes are still to come: a BOM may open it
    _framed: bool = False  # an event came: the engine's answer is a stream (``unstreamed``)
    _choices: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (prompt, completion)

    def feed(self, data: bytes) -> list[bytes]:
        """Bytes from the engine -> complete SSE events to send to the client, rewritten.

        Nothing after ``[DONE]`` is passed on. Lines may end in CRLF or CR as SSE allows (a CR
        that ends one piece ends its line at once, so that its event is not held until the engine
        sends more; an LF that starts the next piece is then that CR's). Only the new bytes are
        normalised and searched: an engine's huge line arriving in many pieces costs linear time,
        not a rescan of all it buffered per piece (a 50 MB line in 64 KB pieces took 43 s of the
        event loop). An event passing ``max_event_bytes`` sets ``too_large``:
        the events before it are returned, nothing more is taken."""
        if self.done or self.too_large:
            return []
        if data:  # (an empty piece tells nothing of the CR before it)
            crlf = self._after_cr and data.startswith(b"\n")
            self._after_cr = data.endswith(b"\r")
            data = data[1:] if crlf else data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._buffer += data
        if self._at_start and not self._past_bom():
            return []
        out: list[bytes] = []
        while not self.done:
            end = self._buffer.find(b"\n\n", max(self._scanned - 1, 0))
            if end < 0:
                self._scanned = len(self._buffer)
                self._refuse_past(len(self._buffer))
                break
            if self._refuse_past(end):
                break
            event = bytes(self._buffer[:end])
            del self._buffer[: end + 2]
            self._scanned, self._framed = 0, True
            rewritten = self._event(event)
            if rewritten is not None:
                out.append(rewritten + b"\n\n")
        return out

    def close(self) -> list[bytes]:
        """The engine's stream ended: an event left without its blank line, taken as one; or,
        when no event came before, the engine's whole answer in one JSON body, as its stream."""
        rest = bytes(self._buffer).strip(b"\n")
        self._buffer, self._scanned, self._after_cr = bytearray(), 0, False
        if self.done or self.too_large or not rest:
            return []
        stream = None if self._framed else as_stream(rest)
        if stream is not None:
            return self.feed(stream)
        rewritten = self._event(rest)
        return [] if rewritten is None else [rewritten + b"\n\n"]

    def _past_bom(self) -> bool:
        """Whether the stream's first bytes are known, a BOM among them dropped: as SSE says, or
        the first event, its line no "data:" line, would be dropped. Before three bytes came, they
        may be a BOM the network split: they are held."""
        if len(self._buffer) < len(BOM) and BOM.startswith(self._buffer):
            return False
        if self._buffer.startswith(BOM):
            del self._buffer[: len(BOM)]
        self._at_start = False
        return True

    def _refuse_past(self, size: int) -> bool:
        """An event of ``size`` bytes (so far) passes the limit: drop what is buffered, stop."""
        if self.max_event_bytes is None or size <= self.max_event_bytes:
            return False
        self.too_large = True
        self._buffer, self._scanned, self._after_cr = bytearray(), 0, False
        return True

    def _event(self, event: bytes) -> bytes | None:
        """``_rewrite``, but nothing after the engine's error event other than its ``[DONE]``: a
        client reads the error as the stream's end (its counts still count)."""
        failed = self.failed
        rewritten = self._rewrite(event)
        return rewritten if not failed or self.done else None

    def _rewrite(self, event: bytes) -> bytes | None:
        """One event's data lines (joined as SSE joins them) -> what the client gets, or None.
        Only ``data:`` events carrying ``[DONE]`` or a strict JSON object are passed on: comments,
        other fields and garbage (no JSON, invalid UTF-8, NaN) are dropped, so the client's
        stream stays OpenAI's (every event ``data: {...}``)."""
        if event.startswith(b"data:") and b"\n" not in event:
            payload = event[5:]
        else:  # several lines: keep the data lines' values
            lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
            if not lines:
                return None
            payload = b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines)
        payload = payload.strip()
        if payload == DONE:
            self.done = True
            return b"data: [DONE]"
        try:
            chunk = strict_json(payload)
        except (ValueError, RecursionError):
            return None
        if not isinstance(chunk, dict):
            return None
        if chunk.get("error") is not None:
            self.failed = True
            return b"data: " + engine_error(error_status(chunk), chunk).body()
        choices = chunk.get("choices")
        if not choices and chunk.get("usage") is not None:
            # The engine's final usage-only chunk: the whole request's.
            self._take_usage(chunk.get("usage"))
            return b"data: " + _dump(chunk) if self.include_usage else None
        if isinstance(choices, list):
            self._take_choice_usage(choices, chunk.get("usage"))
        texts = sum(_has_text(c) for c in choices) if isinstance(choices, list) else 0
        if texts:
            self.texts += texts
            self._token(time.monotonic())
        if not self.include_usage:
            chunk.pop("usage", None)
        elif not self.continuous_usage:
            chunk["usage"] = None
        return b"data: " + _dump(chunk)

    def _take_usage(self, usage: Any) -> None:
        """The request's totals; a count that is missing or no valid count keeps the running one."""
        if isinstance(usage, dict):
            prompt, completion = (
                token_count(usage.get("prompt_tokens")),
                token_count(usage.get("completion_tokens")),
            )
            self.prompt_tokens = self.prompt_tokens if prompt is None else prompt
            self.completion_tokens = self.completion_tokens if completion is None else completion
            self.reported = self.reported or completion is not None

    def _take_choice_usage(self, choices: list[Any], usage: Any) -> None:
        """A chunk's running counts, which are its choice's alone: the request's are the sum over
        its choices (prompts counted once per prompt, ``choices_per_prompt`` choices each)."""
        if not isinstance(usage, dict):
            return
        prompt, completion = (
            token_count(usage.get("prompt_tokens")),
            token_count(usage.get("completion_tokens")),
        )
        self.reported = self.reported or completion is not None
        for choice in choices:
            # A valid index is a non-negative int like a count; anything else is choice 0.
            index = token_count(choice.get("index") if isinstance(choice, dict) else None) or 0
            before = self._choices.get(index, (0, 0))
            self._choices[index] = (
                before[0] if prompt is None else prompt,
                before[1] if completion is None else completion,
            )
        prompts = {i // self.choices_per_prompt: p for i, (p, _) in self._choices.items()}
        # Each count fits, their sum over many choices may not: clamped to what the columns hold.
        self.prompt_tokens = min(sum(prompts.values()), MAX_TOKENS)
        self.completion_tokens = min(sum(c for _, c in self._choices.values()), MAX_TOKENS)

    def _token(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
        self.last_token_at = now

    def take_response(self, body: dict[str, Any]) -> None:
        """A whole (non-streamed) response: its usage (no token timing: it arrives all at once)."""
        self._take_usage(body.get("usage"))
        choices = body.get("choices")
        self.texts += sum(_has_text(c) for c in choices) if isinstance(choices, list) else 0

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
    delta = choice.get("delta", choice.get("message"))  # a chunk's, or a whole chat answer's
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    return bool(choice.get("text"))


def _dump(chunk: dict[str, Any]) -> bytes:
    try:
        return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in the engine's JSON): escape it
        return json.dumps(chunk, separators=(",", ":")).encode()
