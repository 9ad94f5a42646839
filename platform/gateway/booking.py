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
    prompt_tokens = meter.prompt_tokens
    if outcome == "disconnected" and not prompt_tokens:
        counted = await count_prompt_tokens(client, target, admission.model_name, request, brief=cancelled)
        prompt_tokens = min(counted or 0, MAX_TOKENS)  # an engine's count fits the columns
    result = services.Outcome(
        deployment_id=target.deployment_id,
        stream=request.stream,
        outcome=outcome,
        prompt_tokens=prompt_tokens,
        completion_tokens=meter.completion_tokens,
        ttft_s=meter.ttft_s,
        tbt_mean_s=meter.tbt_mean_s,
        tbt_max_s=meter.tbt_max_s,
    )
    await database_sync_to_async(services.finish)(admission, result)


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
