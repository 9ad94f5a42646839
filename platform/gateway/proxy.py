"""The /v1 gateway as a plain ASGI application (mounted by config/asgi.py in front of Django).

Why not a Django async view: Django 5's ASGI handler would notice a disconnect during a streaming
response too (it cancels the response iterator), but every request would cross the synchronous
middleware stack (sessions, CSRF, auth, messages: thread hops) that an API-key endpoint does not
need, and the disconnect would surface as a cancellation somewhere inside httpx rather than as an
event the proxy handles. A plain ASGI app owns ``receive``: while a response streams, a watcher
task waits on ``receive()`` for ``http.disconnect`` (daphne queues it when the client's connection
drops) and cancels the relay at once, which closes the httpx stream to the engine; vLLM sees its
connection close and aborts the request ("Aborted request ..." in its log,
``vllm:num_requests_running`` drops). A non-streamed request is given up the same way while the
gateway waits for its answer. Either is booked, as "disconnected", with the usage the engine
reported so far; one that left before the engine reported any (a non-streamed answer carries its
usage at its end) with its prompt tokens as that engine counts them (``prompt_count``). So is
a request whose task is cancelled (daphne's shutdown, or its application_close_timeout after a
client left): ``booking`` runs to its end before the cancellation is raised. The relay
reads the next upstream chunk only after ``send()`` of the previous one returned, so the engine is
never read faster than the server accepts bytes.
Under daphne that is the whole backpressure there is: daphne's ``send()`` returns once Twisted has
taken the bytes, and Twisted does not push back on a client that stops reading, so such a client's
chunks queue in the server (bounded by the request's ``max_tokens``) until it reads or leaves.
An ASGI server with write flow control (uvicorn) makes ``send()`` itself wait. Bypassing
Django's middleware and URL resolver also keeps the per-chunk and per-request cost low.

An engine that fails after it started to answer is not retried (it may have generated already):
the client gets a 502 (504 on a read timeout) if nothing was sent yet, else a final SSE error event
in place of ``[DONE]``; either way the request is recorded as failed. So is one whose answer (or
one SSE event of it) passes GATEWAY_MAX_ENGINE_BODY_BYTES (GATEWAY_MAX_ENGINE_EVENT_BYTES): it is
read only that far, then the engine's connection is closed. An engine that keeps its stream open
after ``[DONE]`` (or its error event) is closed ``AFTER_DONE_S`` later: the client's stream ends then.
That relay of one engine's answer is gateway/relay.py.

Every response carries an ``x-request-id`` (``req_`` and 32 hex digits, as OpenAI's: the SDK
shows it as a response's ``_request_id`` and an error's ``request_id``). The engine gets it as
``X-Request-Id``, which vLLM makes its own request's id (``chatcmpl-req_...``: its answer's ``id``,
and its log lines of the request with ``--enable-log-requests``): the id a user quotes finds the
request there, as it does the gateway's log lines about the request (``request_ids``). A client's
own X-Request-Id is not passed on (no header of the client's is).

Routes: ``GET /v1/models``, ``GET /v1/models/{model}`` (and HEAD of both: the same status and
headers, no body), ``POST /v1/chat/completions``, ``POST /v1/completions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
from accounts.models import ApiKey
from channels.db import database_sync_to_async
from django.conf import settings

from gateway import request_ids, services
from gateway.asgi_io import (
    ClientGone,
    Receive,
    Scope,
    Send,
    app_path,
    noting_end,
    noting_start,
    raising_gone,
    read_body,
    respond,
    wait_for_disconnect,
    with_headers,
    without_body,
)
from gateway.booking import book, settle, to_the_end
from gateway.cache_salt import with_user_salt
from gateway.errors import GatewayError, internal_error, upstream_lost
from gateway.relay import relay_stream, relay_whole
from gateway.request_ids import RequestLog, new_request_id
from gateway.routing import Router, Target
from gateway.streaming import StreamMeter, upstream_body
from gateway.validation import CompletionRequest, parse_body, validate

log = RequestLog(logging.getLogger(__name__))  # its lines name the request (request_ids.current)
# httpx logs every request at INFO: one line per proxied request is noise and per-request cost.
logging.getLogger("httpx").setLevel(logging.WARNING)

ClientFactory = Callable[[], httpx.AsyncClient]

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
MODEL_PREFIX = "/v1/models/"  # + a model's name: models.retrieve
# The methods of the model routes: a GET resource answers HEAD too (RFC 9110 9.1).
READ_METHODS = ("GET", "HEAD")
IDENTITY = {"accept-encoding": "identity"}
# An engine's refusal of the gateway's own engine key: a failed replica, not the client's error.
ENGINE_REFUSED_GATEWAY = (401, 403)


def default_client() -> httpx.AsyncClient:
    """One pooled client per process: upstream connections are reused across requests."""
    timeout = httpx.Timeout(
        connect=settings.GATEWAY_CONNECT_TIMEOUT_S,
        read=settings.GATEWAY_READ_TIMEOUT_S,
        write=30.0,
        pool=None,
    )
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


class GatewayApp:
    """OpenAI-compatible front door: authenticate, validate, admit (quotas, replicas), proxy with failover."""

    def __init__(self, router: Router | None = None, client_factory: ClientFactory = default_client) -> None:
        self.router = router or Router()
        self._client_factory = client_factory
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1") or None
        path, method = app_path(scope).rstrip("/"), scope["method"]
        request_id = new_request_id()
        named = request_ids.current.set(request_id)  # for this task and those it starts
        send = with_headers(send, [(b"x-request-id", request_id.encode())])
        started: list[bool] = []  # whether the answer's headers went out
        send = noting_start(send, started)
        if method == "HEAD":  # answered as GET, without the body (errors too)
            send = without_body(send)
        try:
            if path == "/v1/models" and method in READ_METHODS:
                data = await database_sync_to_async(services.served_models)(authorization)
                await respond(send, 200, json.dumps({"object": "list", "data": data}).encode())
            elif path.startswith(MODEL_PREFIX) and method in READ_METHODS:
                name = path.removeprefix(MODEL_PREFIX)
                model = await database_sync_to_async(services.served_model)(authorization, name)
                await respond(send, 200, json.dumps(model).encode())
            elif path in ROUTES and method == "POST":
                # The key first: a caller without one learns nothing about what a body should be.
                key = await database_sync_to_async(services.authenticate)(authorization)
                request = validate(ROUTES[path], parse_body(await read_body(receive)))
                await self._complete(replace(request, request_id=request_id), key, receive, send)
            elif path in ROUTES or path == "/v1/models" or path.startswith(MODEL_PREFIX):
                allowed = ("POST",) if path in ROUTES else READ_METHODS  # a 405 names them (RFC 9110)
                message = f"Method {method} is not allowed on {path}; use {' or '.join(allowed)}."
                allow = ", ".join(allowed).encode()
                raise GatewayError(405, message, code="method_not_allowed", extra_headers=[(b"allow", allow)])
            else:
                raise GatewayError(404, f"Unknown endpoint {path}.", code="unknown_url")
        except GatewayError as error:
            await respond(send, error.status, error.body(), error.headers())
        except ClientGone:
            return
        except Exception as exc:  # answered in OpenAI's shape, with the request id
            if started:  # mid-answer: nothing left to say but closing the connection
                raise
            failure = internal_error(exc)
            await respond(send, failure.status, failure.body(), failure.headers())
        finally:
            request_ids.current.reset(named)

    async def _complete(self, request: CompletionRequest, key: ApiKey, receive: Receive, send: Send) -> None:
        started = time.monotonic()
        admission = await _admit(key, request)
        try:
            await self._serve(request, admission, started, receive, send)
        finally:  # finish released its token reservation, unless no engine took the request
            if admission.reservation is not None and not admission.reservation.released:
                await database_sync_to_async(services.release)(admission)

    async def _serve(
        self,
        request: CompletionRequest,
        admission: services.Admission,
        started: float,
        receive: Receive,
        send: Send,
    ) -> None:
        if admission.limits is not None:  # OpenAI's x-ratelimit-* headers on whatever answers
            send = with_headers(send, admission.limits.headers())
        meter = StreamMeter(
            started,
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
            choices_per_prompt=request.body.get("n") or 1,
            max_event_bytes=settings.GATEWAY_MAX_ENGINE_EVENT_BYTES,
        )
        state: dict[str, Any] = {"target": None, "outcome": "failed"}
        answered: list[bool] = []  # whether the answer's last body message went out
        # The relay's error, raised once the request is booked: a GatewayError from before the
        # first byte (answered then), ClientGone (the server's send() found the client gone), or
        # a failure of the gateway itself.
        error: BaseException | None = None
        cancelled: asyncio.CancelledError | None = None
        relay_send = noting_end(raising_gone(send), answered)
        relay = asyncio.ensure_future(self._relay(request, admission, meter, state, relay_send))
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError as exc:
            # Daphne cancels the task at shutdown, or application_close_timeout after its client
            # left: what the engine served is booked all the same (below), then this is raised.
            cancelled = exc
        finally:
            if not relay.done():  # the client left (or we are cancelled): stop the upstream request
                relay.cancel()
                # Not a client that left after [DONE], nor after the whole answer: daphne reports
                # http.disconnect as soon as it went out, while the relay may still be closing
                # the engine's connection (an error it answered stays "failed", as does a stream
                # that ended on the engine's error event).
                if state["outcome"] != "completed" and not meter.failed and not answered:
                    state["outcome"] = "disconnected"
            watcher.cancel()
            # A cancellation of this task while the two end (the relay closes the engine's stream:
            # daphne may cancel meanwhile) is kept, to be raised after the booking, like one above.
            cancelled = await settle(watcher) or cancelled
            cancelled = await settle(relay) or cancelled
            failed = None if watcher.cancelled() else watcher.exception()
            if failed is not None:  # receive() itself failed: raised, as before
                raise failed
            error = None if relay.cancelled() else relay.exception()
            gone = isinstance(error, ClientGone) and not meter.failed and not answered
            if gone and state["outcome"] != "completed":
                state["outcome"] = "disconnected"  # as when receive() tells of it first
        target: Target | None = state["target"]
        if target is not None:  # an engine took the request: what it served counts
            booking = book(
                self.client, request, admission, meter, target, state["outcome"], cancelled is not None
            )
            await to_the_end(booking)
        if cancelled is not None:
            raise cancelled
        if error is not None:
            raise error

    async def _open(
        self, request: CompletionRequest, admission: services.Admission, state: dict[str, Any]
    ) -> tuple[Target, httpx.Response]:
        """Send to the best replica; on a connection error, a 5xx, or a 401/403 before any byte,
        the next one. An engine answers 401 only to its own key (the deployment's, which the
        gateway sends: serving/vllm_ext/engine_auth.py), so a 401 or 403 is that replica refusing
        the gateway (an engine still running with the key of an earlier SECRET_KEY), never the
        client's key: relayed, a client would take its own key for invalid and not retry.

        ``state["target"]`` is the replica while it has the request: one that took it and then
        timed out, or whose client left before its headers (vLLM sends a non-streamed answer's
        with its body), is recorded with it. It has the request once it was sent (httpcore's
        trace: the wait for the answer's headers starts), not while the connection is being made:
        a client that leaves while a dead host's connect hangs asked no engine for anything."""
        path = "/v1/chat/completions" if request.kind == "chat" else "/v1/completions"
        body = {**request.body, "model": admission.model_name}
        if admission.user_id is not None:
            body = with_user_salt(body, admission.user_id)
        encoded = json.dumps(upstream_body(body, request.stream)).encode()
        errors: list[str] = []
        for target in self.router.order(admission.targets):
            upstream = self.client.build_request(
                "POST",
                target.base_url + path,
                content=encoded,
                # No compression (httpx offers gzip and deflate): one compressed piece may decode
                # to a thousand times its size, past what the answer's size limits mean to bound.
                headers={**target.headers(), "x-request-id": request.request_id, **IDENTITY},
                extensions={"trace": _when_sent(state, target)},
            )
            self.router.acquire(target)
            try:
                response = await self.client.send(upstream, stream=True)
            except httpx.ReadTimeout:
                # The engine took the request and may still be generating (a non-streamed answer
                # sends its headers only at the end): another replica would do the work twice.
                state["target"] = target  # a read: the request was sent
                self.router.release(target)
                raise upstream_lost(
                    f"The engine did not answer within {settings.GATEWAY_READ_TIMEOUT_S:g} s.", timed_out=True
                ) from None
            except httpx.TransportError as exc:
                state["target"] = None
                self.router.release(target)
                self.router.failed(target)
                errors.append(f"replica {target.replica_id}: {type(exc).__name__}")
                log.warning("gateway: replica %s failed before the first byte: %r", target.replica_id, exc)
                continue
            except BaseException:
                self.router.release(target)
                raise
            if response.status_code >= 500 or response.status_code in ENGINE_REFUSED_GATEWAY:
                state["target"] = None
                try:
                    await response.aclose()
                finally:  # also when the client leaves (the relay is cancelled) while it closes
                    self.router.release(target)
                self.router.failed(target)
                errors.append(f"replica {target.replica_id}: HTTP {response.status_code}")
                log.warning(
                    "gateway: replica %s failed before the first byte: HTTP %s",
                    target.replica_id,
                    response.status_code,
                )
                continue
            state["target"] = target
            return target, response
        log.warning("gateway: every replica of %s failed: %s", admission.model_name, "; ".join(errors))
        raise GatewayError(
            503,
            f"Every replica of model '{admission.model_name}' failed; retry later.",
            "service_unavailable",
            "upstream_failed",
            retry_after_s=settings.GATEWAY_UNAVAILABLE_RETRY_AFTER_S,
        )

    async def _relay(
        self,
        request: CompletionRequest,
        admission: services.Admission,
        meter: StreamMeter,
        state: dict[str, Any],
        send: Send,
    ) -> None:
        target, response = await self._open(request, admission, state)
        try:
            if response.status_code != 200 or not request.stream:
                await relay_whole(self.router, target, response, meter, state, send)
            else:
                await relay_stream(self.router, target, response, meter, state, send)
        finally:
            try:
                with contextlib.suppress(httpx.HTTPError):  # what the client gets is decided already
                    await response.aclose()
            finally:  # also when cancelled (again) while it closes
                self.router.release(target)


def _when_sent(state: dict[str, Any], target: Target) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` callback that sets ``state["target"]`` once the request is sent."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith(".receive_response_headers.started"):  # http11. or http2.
            state["target"] = target

    return trace


async def _admit(key: ApiKey, request: CompletionRequest) -> services.Admission:
    """``services.admit`` in a worker thread. A thread cannot be stopped: when the request is
    cancelled meanwhile (daphne cancels a request's task at shutdown or when its client goes), the
    admission still completes, and its token reservation is released here instead of holding the
    key's quota until it expires."""
    admitting = asyncio.ensure_future(
        database_sync_to_async(services.admit)(key, request.model, body=request.body, kind=request.kind)
    )
    try:
        return await asyncio.shield(admitting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # a refused admission reserved nothing
            late = await admitting
            await database_sync_to_async(services.release)(late)
        raise
