"""An engine's whole answer to a streamed request, as the stream the client asked for.

An engine (or a proxy in front of it that drops ``stream``) may answer a streamed request with one
JSON completion, the answer in full. Read as SSE it holds no event: the client was told the stream
"ended early" although the engine had generated the whole answer, and the request was booked
failed without its tokens. ``StreamMeter`` hands such a body (its stream ended without one event,
whatever its content type said) to ``as_stream``: the SSE stream vLLM would have sent, which the
meter then relays as it does an engine's (the usage chunk only to a client that asked for it, the
usage booked). A JSON error object is the engine's error event; anything else stays no stream.
"""

from __future__ import annotations

import json
from typing import Any

from core import strict_json as strict


def as_stream(payload: bytes) -> bytes | None:
    """The SSE events of ``payload``, an engine's whole answer, or None if it is neither a
    completion nor an error (strict JSON objects).

    A completion (an object with a list of ``choices``) is one chunk with every choice (chat: its
    ``message`` as a ``delta``), then a usage-only chunk with its ``usage`` if it has one, then
    ``[DONE]``. An error (``{"error": ...}``) is an error event, without ``[DONE]`` (a failed
    stream ends with its error).
    """
    try:
        body = strict.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    if body.get("error") is not None:
        return _event(body)
    if not isinstance(body.get("choices"), list):
        return None
    chunk = {key: value for key, value in body.items() if key != "usage"}
    if chunk.get("object") == "chat.completion":
        chunk["object"] = "chat.completion.chunk"
    chunk["choices"] = [_as_delta(choice) for choice in body["choices"]]
    usage = body.get("usage")
    ending = _event({**chunk, "choices": [], "usage": usage}) if isinstance(usage, dict) else b""
    return _event(chunk) + ending + b"data: [DONE]\n\n"


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _as_delta(choice: Any) -> Any:
    """A chat choice's ``message`` as a chunk's ``delta`` (the message's fields that are set; a
    stream's tool calls name the call they add to by ``index``). A legacy completion's choice (its
    ``text``) is a chunk's as it is."""
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return choice
    delta = {key: value for key, value in choice["message"].items() if value is not None}
    if isinstance(delta.get("tool_calls"), list):
        calls = enumerate(delta["tool_calls"])
        delta["tool_calls"] = [{"index": i, **call} if isinstance(call, dict) else call for i, call in calls]
    return {**{key: value for key, value in choice.items() if key != "message"}, "delta": delta}
