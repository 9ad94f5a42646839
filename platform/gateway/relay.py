"""One engine's answer relayed to the /v1 client (gateway/proxy.py opened the request): read
whole and answered in one go (non-streamed, or the engine's error), or streamed event by event
through a ``StreamMeter``, each within its size limit. ``state["outcome"]`` says how it ended
("completed" or "failed"), for the booking; an engine that fails mid-answer is marked failed in the
``Router``, so the next requests try other replicas first."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from django.conf import settings

from gateway.asgi_io import Send, respond
from gateway.errors import GatewayError, engine_error, error_status, upstream_lost
from gateway.request_ids import RequestLog
from gateway.routing import Router, Target
from gateway.streaming import StreamMeter, strict_json

# Under the proxy's logger name, as before this part moved out of it: "gateway.proxy" in log lines.
log = RequestLog(logging.getLogger("gateway.proxy"))

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


# How long an engine may keep its stream open after its [DONE]. vLLM ends the stream right after
# it, and reading that end lets the connection serve the next request; the client's stream ends
# only then (the async OpenAI SDK, like curl, reads an HTTP/1.1 answer to its end after [DONE]).
# An engine that stays open is not waited for: the client would wait for its read timeout.
AFTER_DONE_S = 1.0


async def relay_whole(
    router: Router,
    target: Target,
    response: httpx.Response,
    meter: StreamMeter,
    state: dict[str, Any],
    send: Send,
) -> None:
    """A non-streamed answer or an engine's error: read it all, then answer in one go. One
    larger than GATEWAY_MAX_ENGINE_BODY_BYTES is given up as soon as it passes the limit (the
    relay then closes the engine's connection, which aborts the request there)."""
    try:
        payload = await read_at_most(response, settings.GATEWAY_MAX_ENGINE_BODY_BYTES)
    except httpx.HTTPError as exc:
        error = lost(router, target, exc)
        await respond(send, error.status, error.body(), error.headers())
        return
    if payload is None:
        error = too_large(target, "answer", settings.GATEWAY_MAX_ENGINE_BODY_BYTES)
        await respond(send, error.status, error.body(), error.headers())
        return
    if response.status_code >= 400:  # 4xx: 5xx went to another replica
        error = engine_error(response.status_code, json_or_none(payload))
        await respond(send, error.status, error.body(), error.headers())
        return
    body = json_or_none(payload) if response.status_code == 200 else None
    if not isinstance(body, dict):
        # Another 2xx or a 3xx, or a 200 that is no (strict) JSON object: no answer a client
        # could read as a completion. A 502, recorded as failed (what the engine reported).
        log.warning(
            "gateway: replica %s answered HTTP %s with no JSON object",
            target.replica_id,
            response.status_code,
        )
        error = upstream_lost("The engine's answer was not a completion.", timed_out=False)
        await respond(send, error.status, error.body(), error.headers())
        return
    if body.get("error") is not None and not body.get("choices"):
        # An error in a 200 (as a streamed one comes in an event): the client gets it as an
        # error, and the request is booked failed, not completed.
        meter.take_response(body)
        error = engine_error(error_status(body), body)
        await respond(send, error.status, error.body(), error.headers())
        return
    meter.take_response(body)
    state["outcome"] = "completed"
    await respond(send, 200, payload, [(b"content-type", b"application/json")])


async def relay_stream(
    router: Router,
    target: Target,
    response: httpx.Response,
    meter: StreamMeter,
    state: dict[str, Any],
    send: Send,
) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    try:
        try:
            async with asyncio.timeout(None) as after_done:
                # Decoded as the answer's content-encoding says, should the engine (or a proxy
                # in front of it) compress although it was asked not to.
                async for data in response.aiter_bytes():
                    events = meter.feed(data)
                    if events:
                        body = b"".join(events)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                    if (meter.done or meter.failed) and after_done.when() is None:
                        # The client has the whole response (or the engine's error, after which
                        # nothing but [DONE] is relayed): one that hangs up now, before the
                        # engine closes its end, was served in full (or told of the error).
                        state["outcome"] = "failed" if meter.failed else "completed"
                        after_done.reschedule(asyncio.get_running_loop().time() + AFTER_DONE_S)
                    if meter.too_large:  # the relay closes the engine's connection: vLLM aborts
                        break
        except TimeoutError:
            if not after_done.expired():
                raise
            # The engine kept its stream open after [DONE] or its error: the client's ends
            # now (the relay then closes the engine's connection).
            log.warning("gateway: replica %s kept a stream open after its end", target.replica_id)
        events = meter.close()
        if meter.too_large:
            error = too_large(target, "SSE event", settings.GATEWAY_MAX_ENGINE_EVENT_BYTES)
            events.append(b"data: " + error.body() + b"\n\n")
        elif not meter.done and not meter.failed:  # closed without [DONE], nor its error: cut off
            log.warning("gateway: replica %s ended a stream without [DONE]", target.replica_id)
            error = upstream_lost("The engine serving this request ended its stream early.", False)
            events.append(b"data: " + error.body() + b"\n\n")
        if events:
            await send({"type": "http.response.body", "body": b"".join(events), "more_body": True})
        state["outcome"] = "failed" if meter.failed or not meter.done else "completed"
    except httpx.HTTPError as exc:
        if not meter.done:  # the stream broke off: say so, where [DONE] would have come
            error = lost(router, target, exc)
            event = b"data: " + error.body() + b"\n\n"
            if not meter.failed:  # unless the engine's error said it: one error event
                await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def lost(router: Router, target: Target, exc: httpx.HTTPError) -> GatewayError:
    """``target`` failed after it had started to answer: try others first for a while."""
    router.failed(target)
    log.warning("gateway: replica %s failed mid-response: %r", target.replica_id, exc)
    timed_out = isinstance(exc, httpx.TimeoutException)
    what = "stopped answering" if timed_out else "failed"
    return upstream_lost(f"The engine serving this request {what} mid-response.", timed_out)


async def read_at_most(response: httpx.Response, limit: int) -> bytes | None:
    """``response``'s body, or None as soon as it passes ``limit`` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(target: Target, what: str, limit: int) -> GatewayError:
    """``target`` sent an answer (or one event of it) past ``limit``: the request is cut off. The
    replica is not marked failed: a request asking for a huge answer is no sign of a sick engine.
    Nor should the client retry it (``x-should-retry: false``): the same request would have an
    engine generate the same oversized answer again, only to be cut off again."""
    log.warning("gateway: replica %s sent an %s over %d bytes: cut off", target.replica_id, what, limit)
    message = f"The engine's {what} was larger than the gateway relays ({limit} bytes)."
    return upstream_lost(message, timed_out=False, retry=False)


def json_or_none(payload: bytes) -> Any:
    try:
        return strict_json(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
