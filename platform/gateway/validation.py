"""Checks of /v1/chat/completions and /v1/completions bodies before anything is routed.

Only the fields whose type the gateway can judge are checked; other fields pass through to the
engine unchanged (vLLM accepts extra sampling parameters). A bad body is a 400 naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.cache_salt import check_client_salt
from gateway.errors import GatewayError, bad_request

MAX_BODY_BYTES = 4 << 20
# Deeper than any real request (tool and response_format schemas nest a few dozen levels at most)
# and well under Python's recursion limit (1000), which json.loads and json.dumps both hit near it:
# a body parse_body accepts can always be re-encoded for the engine.
MAX_JSON_DEPTH = 128

NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
POSITIVE_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n")
INT_FIELDS = ("seed", "top_k")  # signed 64-bit, as vLLM takes them (it answers a larger top_k with a 500)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
BOOL_FIELDS = ("stream", "echo")
STRING_FIELDS = ("user", "suffix")
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True)
class CompletionRequest:
    """A validated request: what routing, quotas and streaming need from it; ``body`` is forwarded."""

    kind: str  # "chat" or "completion"
    model: str
    stream: bool
    include_usage: bool  # the client asked for a final usage chunk
    body: dict[str, Any]
    continuous_usage: bool = False  # ... and for the usage so far on every chunk (vLLM's extension)
    request_id: str = ""  # the gateway's id of the request (proxy.new_request_id), set by the proxy


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def body_too_large() -> GatewayError:
    return GatewayError(413, f"request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``; 400 if it is not one, nests too deeply or holds a non-finite number.

    Python's ``json`` reads the literals ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON) and a
    number too large for a float (``1e400``) as infinity; forwarded, the engine would get a body
    that is not JSON, or a value no client can have meant. They are refused here, for every field.
    """
    if len(raw) > MAX_BODY_BYTES:
        raise body_too_large()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    _check_tree(body)
    return body


def _too_deep() -> GatewayError:
    return bad_request(f"request body is nested too deeply (more than {MAX_JSON_DEPTH} levels)")


def _non_finite(field: str, directly: bool) -> GatewayError:
    if directly:
        return bad_request(
            f"'{field}' must be a finite number (not NaN, Infinity or one too large for a float)", field
        )
    return bad_request(
        f"request body has a non-finite number (NaN, Infinity or one too large) inside '{field}'; "
        "JSON numbers must be finite"
    )


def _check_tree(body: dict[str, Any]) -> None:
    """400 if ``body`` nests more than ``MAX_JSON_DEPTH`` arrays and objects deep or holds a
    non-finite number anywhere. Iterative: no recursion limit to hit.

    A non-finite value of a top-level field is named as the error's ``param``; one deeper is named
    in the message by the top-level field that holds it.
    """
    for name, value in body.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise _non_finite(name, directly=True)
    # (container, its depth, the top-level field it is in)
    pending: list[tuple[Any, int, str]] = [
        (value, 2, name) for name, value in body.items() if isinstance(value, dict | list)
    ]
    while pending:
        item, depth, field = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                pending.append((child, depth + 1, field))
            elif isinstance(child, float) and not math.isfinite(child):
                raise _non_finite(field, directly=False)


def _check_common(body: dict[str, Any]) -> tuple[str, bool, bool, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    if "\x00" in model:  # no model's name: PostgreSQL text cannot hold NUL, so the lookup would fail
        raise bad_request("'model' must not contain a NUL character", "model")
    for name in NUMBER_FIELDS:
        if name in body and body[name] is not None and not _is_number(body[name]):
            raise bad_request(f"'{name}' must be a number, not {body[name]!r}", name)
    for name in POSITIVE_INT_FIELDS:
        if name in body and body[name] is not None and (not _is_int(body[name]) or body[name] <= 0):
            raise bad_request(f"'{name}' must be a positive integer, not {body[name]!r}", name)
    for name in INT_FIELDS:
        if name in body and body[name] is not None and not _is_int(body[name]):
            raise bad_request(f"'{name}' must be an integer, not {body[name]!r}", name)
        if name in body and _is_int(body[name]) and not INT64_MIN <= body[name] <= INT64_MAX:
            raise bad_request(f"'{name}' must be a 64-bit signed integer, not {body[name]!r}", name)
    for name in BOOL_FIELDS:
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be a boolean, not {body[name]!r}", name)
    for name in STRING_FIELDS:
        if name in body and body[name] is not None and not isinstance(body[name], str):
            raise bad_request(f"'{name}' must be a string, not {body[name]!r}", name)
    salt_error = check_client_salt(body)
    if salt_error is not None:
        raise salt_error
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    include_usage = continuous_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options")
        include_usage = usage
        continuous = options.get("continuous_usage_stats")
        if continuous is not None and not isinstance(continuous, bool):  # vLLM takes null for false
            raise bad_request("'stream_options.continuous_usage_stats' must be a boolean", "stream_options")
        continuous_usage = include_usage and continuous is True  # as vLLM: only with include_usage
    return model, stream, include_usage, continuous_usage


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"'messages[{i}]' must be an object", "messages")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(
                f"'messages[{i}].role' must be one of {sorted(CHAT_ROLES)}, not {role!r}", "messages"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(f"'messages[{i}].content' must be a string or a list of parts", "messages")


def _check_prompt(prompt: Any) -> None:
    ok = isinstance(prompt, str) and prompt != ""
    if isinstance(prompt, list) and prompt:
        ok = (
            all(isinstance(p, str) for p in prompt)
            or all(_is_int(p) for p in prompt)
            or all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt)
        )
    if not ok:
        raise bad_request(
            "'prompt' is required: a non-empty string, list of strings, or list of token ids", "prompt"
        )


def validate(kind: str, body: dict[str, Any]) -> CompletionRequest:
    """Check ``body`` for endpoint ``kind`` ("chat" or "completion"); raises a 400 GatewayError."""
    model, stream, include_usage, continuous_usage = _check_common(body)
    if kind == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    return CompletionRequest(kind, model, stream, include_usage, body, continuous_usage)
