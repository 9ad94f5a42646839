"""The most tokens a completion request may cost: what the daily token quota reserves at admission.

As OpenAI counts a request against its token limits: an estimate of the prompt's tokens plus the
most it may generate, ``n`` completions of at most ``max_completion_tokens`` (or, older,
``max_tokens``) each for a chat, of at most ``max_tokens`` each for every prompt of a
/v1/completions batch (that endpoint has no ``max_completion_tokens``: vLLM ignores it there).
The reservation is settled to the engine's real usage when the request ends, so only the
completion part has to be an upper bound; the prompt is estimated from its characters (about four
per token for English text, OpenAI's rule of thumb), token-id prompts are counted exactly.

A chat that names no output limit, or a completion whose ``max_tokens`` is null, may generate
until the model's context is full (vLLM's default): ``context_length - prompt`` per completion,
with the model's registered context length, or ``DEFAULT_MAX_OUTPUT_TOKENS`` where none is known.
A completion without ``max_tokens`` generates at most ``COMPLETION_DEFAULT_MAX_TOKENS`` (16, the
default of OpenAI's and vLLM's /v1/completions). A stated limit above the context is
capped there (the engine cannot generate more, and refuses such a request itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4
# Output tokens per completion reserved for a request without max_tokens when the model's context
# length is unknown (the registry requires one for every model, so only for callers without it).
DEFAULT_MAX_OUTPUT_TOKENS = 4096
# /v1/completions' max_tokens when the request leaves it out (OpenAI's and vLLM's CompletionRequest).
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class TokenEstimate:
    """The most a request may cost: ``prompt_tokens`` (estimated) plus ``completion_tokens``."""

    prompt_tokens: int
    completion_tokens: int
    limit_field: str  # the request's output-limit field: where a client lowers the estimate

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def estimate_tokens(
    body: dict[str, Any], context_length: int | None = None, kind: str | None = None
) -> TokenEstimate:
    """The most tokens a validated chat or completion ``body`` may cost (see the module's doc).

    Args:
        body: the request as ``gateway.validation.validate`` accepted it (chat: ``messages``,
            completion: ``prompt``); output limits and ``n`` are positive integers, null or absent.
        context_length: the model's context in tokens, None if unknown.
        kind: "chat" or "completion", the endpoint's; None: a chat if ``messages`` is a list.
    Returns:
        The estimate; its total is at least one token per prompt.
    """
    if kind is None:
        kind = "chat" if isinstance(body.get("messages"), list) else "completion"
    if kind == "chat":
        limit_field = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
        stated = body.get(limit_field)
    else:  # vLLM's CompletionRequest reads max_tokens alone; absent, 16 (null: no limit)
        limit_field = "max_tokens"
        stated = body.get(limit_field, COMPLETION_DEFAULT_MAX_TOKENS)
    n = body.get("n") or 1
    prompt_total = completion_total = 0
    for prompt in _prompt_sizes(body, kind):
        if context_length is None:
            room = stated or DEFAULT_MAX_OUTPUT_TOKENS
        else:
            room = max(1, context_length - prompt)
            room = min(stated, room) if stated else room
        prompt_total += prompt
        completion_total += n * room
    return TokenEstimate(prompt_total, completion_total, limit_field)


def _prompt_sizes(body: dict[str, Any], kind: str) -> list[int]:
    """Estimated tokens of each prompt: one for a chat, one per prompt of a completions batch."""
    if kind == "chat":  # a completion's stray "messages" is no prompt of it
        chars = sum(_text_length(m.get("content")) for m in body["messages"] if isinstance(m, dict))
        return [_tokens_of(chars)]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [_tokens_of(len(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) for p in prompt):
            return [len(prompt)]  # one prompt of token ids
        return [_tokens_of(len(p)) if isinstance(p, str) else len(p) for p in prompt]
    return [0]


def _text_length(content: Any) -> int:
    """Characters of a message's text: a string, or the ``text`` of its parts (an image or audio
    part's data is not text; its tokens are the engine's to count, and settled at the end)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def _tokens_of(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)
