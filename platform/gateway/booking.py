"""Booking a proxied request once an engine took it: its usage, its sample, its reservation released.

What the engine served is booked whatever ended the request, its task's cancellation included:
daphne cancels an application at shutdown, and one that outlives its client by
``application_close_timeout`` (then again every second until it ends). A booking skipped or cut
short there would leave the engine's tokens out of the key's quota and the latency samples, and
the reservation released in their place. So the booking runs in a task of its own that such a
cancellation does not stop; the cancellation is raised once it is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import httpx
from channels.db import database_sync_to_async

from gateway import services
from gateway.estimate import TokenEstimate
from gateway.prompt_count import count_prompt_tokens
from gateway.request_ids import RequestLog
from gateway.routing import Target
from gateway.streaming import MAX_TOKENS, StreamMeter
from gateway.validation import CompletionRequest

log = RequestLog(logging.getLogger(__name__))  # its lines name the request


async def book(
    client: httpx.AsyncClient,
    request: CompletionRequest,
    admission: services.Admission,
    meter: StreamMeter,
    target: Target,
    outcome: str,
    cancelled: bool,
) -> None:
    """Book what ``target`` served: the usage it reported, or for a request given up before it
    reported any (a non-streamed answer's comes at its end) its prompt as the engine counts it (the
    engine has the prompt all the same). A ``cancelled`` request waits for that count only briefly:
    daphne waits for its cancelled applications at shutdown."""
    prompt_tokens, completion_tokens = meter.prompt_tokens, meter.completion_tokens
    unreported = meter.texts > 0 and not meter.reported  # it served text, but told no usage
    if (outcome == "disconnected" or unreported) and not prompt_tokens:
        counted = await count_prompt_tokens(client, target, admission.model_name, request, brief=cancelled)
        prompt_tokens = min(counted or 0, MAX_TOKENS)  # an engine's count fits the columns
    if unreported:
        estimate = admission.reservation.estimate if admission.reservation is not None else None
        prompt_tokens, completion_tokens = _at_most(prompt_tokens, meter.texts, estimate)
    result = services.Outcome(
        deployment_id=target.deployment_id,
        stream=request.stream,
        outcome=outcome,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_s=meter.ttft_s,
        tbt_mean_s=meter.tbt_mean_s,
        tbt_max_s=meter.tbt_max_s,
    )
    await database_sync_to_async(services.finish)(admission, result)


def _at_most(prompt_tokens: int, texts: int, estimate: TokenEstimate | None) -> tuple[int, int]:
    """The usage booked for a request whose engine served text but reported no usage (vLLM reports
    it when asked, as the gateway does; an engine behind a proxy that drops ``stream_options``, or
    another server, may not): the most it may have cost, never less, so that a key's quota is not
    under-booked. The output is the reservation's bound (``n`` x its output limit, or what the
    context leaves), or ``texts`` if more: every text delta (a whole answer's every choice with
    text) took a token at least, while a delta may carry several (speculative decoding, vLLM's
    ``--stream-interval``) or none come for a token that completes no character: counting them
    could book less than was generated. The prompt is the engine's count, else the estimate."""
    log.warning("gateway: the engine reported no usage; booked the most the request may have cost")
    if estimate is None:
        return prompt_tokens, min(texts, MAX_TOKENS)
    prompt = prompt_tokens or estimate.prompt_tokens
    return min(prompt, MAX_TOKENS), min(max(texts, estimate.completion_tokens), MAX_TOKENS)


async def settle(task: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait until ``task`` is done, however often the calling task is cancelled meanwhile; the
    cancellation that came meanwhile, if any, is returned (for the caller to raise when it is
    ready), not raised. ``task``'s own outcome is left in it."""
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})  # unlike awaiting the task, a cancellation leaves it running
        except asyncio.CancelledError as exc:
            cancelled = exc
    return cancelled


async def to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """``work`` run to its end in a task of its own, however often the calling task is cancelled
    meanwhile; a cancellation that came meanwhile is raised after it."""
    task = asyncio.ensure_future(work)
    cancelled = await settle(task)
    if cancelled is None:
        task.result()
        return
    if not task.cancelled() and task.exception() is not None:
        log.error("gateway: booking a cancelled request failed", exc_info=task.exception())
    raise cancelled
