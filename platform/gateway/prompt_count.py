"""A request's prompt tokens, counted by the engine that took it (vLLM's ``POST /tokenize``).

The engine's usage tells the gateway what a request cost, but only when it gets that far: a
non-streamed answer carries its usage at the end, with the whole body, and a stream's first chunk
carries its running counts. A client that leaves before then (the gateway gives the request up,
which aborts it on the engine) leaves the gateway without counts although the engine has read the
prompt and prefilled it, or was doing so. The gateway then asks the same engine to tokenize the
same prompt: the model's own tokenizer and chat template, as the engine counted it for the request.

What vLLM's usage counts as ``prompt_tokens`` is each prompt once, however many choices (``n``)
were asked of it: a chat's messages with the chat template applied, and each prompt of a legacy
completion (a string, a list of strings, a list of token ids or a list of such lists; token ids
are counted here without asking). Generated tokens of a non-streamed request cannot be counted:
the engine never sent them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from gateway.request_ids import RequestLog
from gateway.routing import Target
from gateway.validation import CompletionRequest

log = RequestLog(logging.getLogger(__name__))  # its lines name the request

# The count runs after the client left, before the request is booked, and holds the request's
# task (and its reservation) until then. A local engine tokenizes in milliseconds; one that does not
# answer in time is booked without a prompt count. A request whose task was cancelled (daphne:
# shutdown, or its application_close_timeout after the client left) waits less: daphne waits for
# its cancelled applications at shutdown.
TOKENIZE_TIMEOUT_S = 3.0
CANCELLED_TOKENIZE_TIMEOUT_S = 0.5

# Fields of a chat request that change what its template makes of the messages; vLLM's tokenize
# request takes them with the same meaning (and defaults) as its chat request.
CHAT_TEMPLATE_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "media_io_kwargs",
    "mm_processor_kwargs",
)


async def count_prompt_tokens(
    client: httpx.AsyncClient,
    target: Target,
    model_name: str,
    request: CompletionRequest,
    brief: bool = False,
) -> int | None:
    """The prompt tokens of ``request`` as the engine of ``target`` (serving ``model_name``) counts them.

    Returns:
        The count, or None if the engine did not give one (it failed, refused or took longer than
        ``TOKENIZE_TIMEOUT_S``, ``CANCELLED_TOKENIZE_TIMEOUT_S`` if ``brief``); the reason is logged.
    """
    try:
        async with asyncio.timeout(CANCELLED_TOKENIZE_TIMEOUT_S if brief else TOKENIZE_TIMEOUT_S):
            if request.kind == "chat":
                return await _tokenize(client, target, _chat_body(model_name, request.body))
            return await _count_completion_prompts(client, target, model_name, request.body)
    except (TimeoutError, httpx.HTTPError, _NoCount) as exc:
        log.warning("gateway: %s did not count a prompt for %s: %r", target.base_url, model_name, exc)
        return None


class _NoCount(Exception):
    """The engine answered, but not with a count."""


def _chat_body(model_name: str, body: dict[str, Any]) -> dict[str, Any]:
    fields = {name: body[name] for name in CHAT_TEMPLATE_FIELDS if body.get(name) is not None}
    return {"model": model_name, "messages": body["messages"], **fields}


async def _count_completion_prompts(
    client: httpx.AsyncClient, target: Target, model_name: str, body: dict[str, Any]
) -> int:
    prompt = body["prompt"]  # validated: a string, or a non-empty list of one kind
    prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
    total = 0
    for one in prompts:
        if isinstance(one, list):  # token ids: the engine takes them as they are
            total += len(one)
            continue
        tokenize = {"model": model_name, "prompt": one}
        if body.get("add_special_tokens") is not None:
            tokenize["add_special_tokens"] = body["add_special_tokens"]
        total += await _tokenize(client, target, tokenize)
    return total


async def _tokenize(client: httpx.AsyncClient, target: Target, body: dict[str, Any]) -> int:
    # With the engine's key: its /tokenize is guarded too (serving/vllm_ext/engine_auth.py).
    response = await client.post(target.base_url + "/tokenize", json=body, headers=target.headers())
    if response.status_code != 200:
        raise _NoCount(f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        count = response.json().get("count")
    except (ValueError, AttributeError):
        count = None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise _NoCount(f"no count in {response.text[:200]!r}")
    return count
