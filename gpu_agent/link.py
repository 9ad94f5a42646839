"""The agent's one websocket to the control plane: `{control_plane}/ws/agent/`.

Per connection: send `register` (and the current deployment statuses) first, then a heartbeat every
`heartbeat_interval_s`, the telemetry the agent submits, and whatever else it sends; read frames
from the control plane and hand valid ones to `on_frame`. A malformed frame is logged, answered with
an `error` frame and skipped: the link stays up.

While disconnected, telemetry goes into a bounded buffer (oldest dropped first, counted in
`dropped`, which every telemetry frame carries) and is flushed in order on reconnect; heartbeats and
other frames are not buffered (the statuses are re-sent on connect). Reconnects back off
exponentially with seeded jitter; a refused token (HTTP 401/403 at the handshake, or close code
4401/4403) is logged as such and retried with the same backoff. So is a refused `register` (an
`error` frame `register_refused` or close code 4422: say, a device another host registered): the
link logs the control plane's reason at ERROR and closes the connection, which would only carry
heartbeats and telemetry the control plane refuses. An `error` frame `not_registered` (a control
plane that keeps the link after refusing `register`) ends the connection the same way, with the
reason of the error frame that refused the `register`. Any other close is a dropped link, logged at
WARNING and retried with the same backoff, counting no refusal: among them 4503
(`CLOSE_TRY_AGAIN`), which the control plane sends when checking the token at the handshake or
storing `register` failed for a passing reason (its database went away or timed out) and the agent
should simply try again.

No single frame may take the link down: one that cannot be serialised (a NaN reading, say, which
strict JSON refuses) is dropped with an error log, and any other unexpected exception in a
connection is logged with its traceback and treated like a lost connection (reconnect with
backoff). Without this one bad telemetry sample ended `run()` for good while the engines kept
running unobserved.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from gpu_agent.protocol import (
    CLOSE_REGISTER_REFUSED,
    CLOSE_TRY_AGAIN,
    ErrorFrame,
    Frame,
    Heartbeat,
    ProtocolError,
    Telemetry,
    dumps,
    loads,
)
from serving.backoff import Backoff

log = logging.getLogger(__name__)


class _HiddenCredentials(logging.Filter):
    """Hides the value of an Authorization header in websockets' DEBUG log of the handshake (it
    logs every request header): "> Authorization: Bearer <the host token>"."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "authorization" in text.lower():
            record.msg, record.args = _AUTHORIZATION.sub(r"\1[hidden]", text), ()
        return True


_AUTHORIZATION = re.compile(r"(?i)(authorization\s*:\s*).*")
# The link's websockets logger: a child of websockets' own ("websockets.client"), so whatever
# level or handler is set there applies, with the filter above.
_WS_LOG = logging.getLogger("websockets.client.agent_link")
_WS_LOG.addFilter(_HiddenCredentials())

AUTH_CLOSE_CODES = (4401, 4403)
AUTH_HTTP_STATUSES = (401, 403)


def _down_reason(exc: Exception) -> str:
    """Why the link went down, for the log: the control plane's own words for a postponed
    `register`, else the exception."""
    if isinstance(exc, ConnectionClosed) and exc.rcvd is not None and exc.rcvd.code == CLOSE_TRY_AGAIN:
        return (
            f"the control plane cannot serve this agent now (close code {CLOSE_TRY_AGAIN}: its database "
            "went away or timed out, at the handshake or storing the register)"
        )
    return f"{type(exc).__name__}: {exc}"


def redacted_url(url: str) -> str:
    """``url`` as logs and error messages show it: any user information (``user:password@``, a
    credential) replaced by ``***``, e.g. ``https://***@cp:8000/prefix``; the real URL is still the
    one connected to. Everything after the scheme up to the last ``@`` counts as user information,
    even past a ``/``: a password with an unescaped ``/`` is hidden too (an ``@`` in a path, which
    no control plane URL needs, hides more than it must)."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme: "user:pw@cp:8000" (refused, but its error names it)
        scheme, rest = "", url
    _, at, after = rest.rpartition("@")
    if not at:
        return url
    return f"{scheme}{sep}***@{after}"


def refuse_user_info(control_plane: str) -> None:
    """ValueError (the URL redacted) when ``control_plane`` carries user information
    (``wss://user:password@cp``). websockets turns it into an ``Authorization: Basic`` header sent
    beside the host token's ``Authorization: Bearer``: two credentials in one header no server can
    tell apart (the control plane reads only the Bearer), and the password goes to the control
    plane and to every proxy on the way. The host token is the agent's only credential."""
    if "@" in urlsplit(control_plane).netloc:  # what websockets reads as user information
        raise ValueError(
            f"control plane URL {redacted_url(control_plane)!r} carries user information"
            " (user:password@): remove it from --control-plane (or the config file's control_plane)."
            " The host token (--token) is the agent's only credential; the URL's would be sent as a"
            " second Authorization header (Basic), which the control plane does not read, showing the"
            " password to it and to every proxy on the way"
        )


def agent_ws_url(control_plane: str) -> str:
    """http(s)://host[:port][/prefix] or ws(s)://... -> ws(s)://host[:port][/prefix]/ws/agent/."""
    url = control_plane.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    if not url.startswith(("ws://", "wss://")):
        shown = redacted_url(control_plane)
        raise ValueError(f"control plane URL {shown!r} must start with http(s):// or ws(s)://")
    if url.endswith("/ws/agent"):
        return url + "/"
    return url + "/ws/agent/"


@dataclass
class LinkStats:
    """Counters for logs, tests and the agent's own status."""

    connects: int = 0
    auth_refusals: int = 0
    register_refusals: int = 0  # connections ended because the control plane refused `register`
    failed_attempts: int = 0
    telemetry_sent: int = 0
    dropped: int = 0  # telemetry frames dropped because the buffer was full
    rejected_frames: int = 0  # malformed frames received
    unsendable: int = 0  # outgoing frames dropped because they could not be serialised


class AuthRefused(Exception):
    """The control plane refused the host token."""


class RegisterRefused(Exception):
    """The control plane refused this agent's `register`; the message says why."""


class AgentLink:
    """Keeps one authenticated websocket to the control plane up until `stop()`."""

    def __init__(
        self,
        control_plane: str,
        token: str,
        *,
        hello: Callable[[], list[Frame]],
        on_frame: Callable[[Frame], Awaitable[None]],
        heartbeat_interval_s: float = 1.0,
        buffer_size: int = 300,
        backoff: Backoff | None = None,
        stable_after_s: float = 5.0,
        open_timeout_s: float = 10.0,
    ) -> None:
        """
        Args:
            control_plane: Base URL of the control plane (http(s):// or ws(s)://), without user
                information (`refuse_user_info`).
            token: The host token, sent as `Authorization: Bearer <token>`.
            hello: Called on every connect; its frames (register first) are sent before anything.
            on_frame: Awaited for every valid frame from the control plane, in arrival order.
            heartbeat_interval_s: Seconds between heartbeats.
            buffer_size: Telemetry frames kept while disconnected.
            backoff: Reconnect delays; default 0.5 s doubling to 30 s with a random seed. Pass a
                per-host seed (`Backoff(seed=seed_for(host))`, as `Agent` does) for reproducible
                delays; never one seed for all hosts, or they all reconnect at the same moments.
            stable_after_s: A connection that lived this long resets the backoff when it ends.
            open_timeout_s: Handshake timeout.
        """
        if buffer_size < 1:
            raise ValueError(f"{buffer_size=} must be >= 1")
        if heartbeat_interval_s <= 0:
            raise ValueError(f"{heartbeat_interval_s=} must be positive")
        self.url = agent_ws_url(control_plane)  # connected to; logs show `shown_url`
        refuse_user_info(self.url)
        self.shown_url = redacted_url(self.url)
        self._token = token
        self._hello = hello
        self._on_frame = on_frame
        self._heartbeat_s = heartbeat_interval_s
        self._buffer: deque[Telemetry] = deque(maxlen=buffer_size)
        self.backoff = backoff or Backoff(seed=random.SystemRandom().getrandbits(64))
        self._stable_after_s = stable_after_s
        self._open_timeout_s = open_timeout_s
        self._ws: ClientConnection | None = None
        self._held: list[Frame] | None = None  # frames sent during the handshake
        self._refusal: str | None = None  # the last error frame of this connection (`_read`)
        self._refused: str | None = None  # why the control plane refused this connection's register
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self.stats = LinkStats()

    @property
    def connected(self) -> bool:
        return self._ws is not None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def submit_telemetry(self, frame: Telemetry) -> None:
        """Queue one telemetry frame; sent at once if connected, else kept (bounded)."""
        if len(self._buffer) == self._buffer.maxlen:
            self.stats.dropped += 1  # deque drops the oldest on append
        self._buffer.append(frame)
        self._wake.set()

    async def send(self, frame: Frame) -> bool:
        """Send a non-telemetry frame now (or right after the hello if a connection is being set
        up); False, and nothing is queued, when disconnected."""
        ws = self._ws
        if ws is None:
            if self._held is not None:
                self._held.append(frame)
                return True
            return False
        text = self._encode(frame)
        if text is None:
            return False
        try:
            await ws.send(text)
        except ConnectionClosed:
            return False
        return True

    def _encode(self, frame: Frame, **changes: Any) -> str | None:
        """The JSON text of `frame` (a dataclass) with `changes` applied, or None (logged,
        counted) when that cannot be serialised or is not a valid frame.

        Dropping is the only way on: the same frame would fail again on every retry, and a frame
        left at the head of the telemetry buffer would block every frame behind it.
        """
        try:
            if changes:  # every frame type is a dataclass
                frame = dataclasses.replace(frame, **changes)  # type: ignore[type-var]
            return dumps(frame)
        except (ValueError, TypeError) as exc:
            self.stats.unsendable += 1
            log.error("Dropped a %r frame that cannot be serialised: %s: %.500r", frame.TYPE, exc, frame)
            return None

    def stop(self) -> None:
        """Ask `run()` to close the connection and return."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Connect, serve the connection, reconnect with backoff; returns after `stop()`."""
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self._session()
            except AuthRefused as exc:
                self.stats.auth_refusals += 1
                reason = str(exc)
            except RegisterRefused as exc:
                self.stats.register_refusals += 1
                reason = f"the control plane refused this agent's register: {exc}"
            except InvalidStatus as exc:
                code = exc.response.status_code
                if code in AUTH_HTTP_STATUSES:
                    self.stats.auth_refusals += 1
                    reason = f"the control plane refused the host token (HTTP {code})"
                else:
                    reason = f"handshake failed with HTTP {code}"
            except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ConnectionClosed) as exc:
                reason = _down_reason(exc)
            except Exception as exc:  # a bug, not the network: log it, but keep the link
                log.exception("Control plane link to %s failed unexpectedly", self.shown_url)
                reason = f"unexpected {type(exc).__name__}: {exc}"
            else:
                reason = "connection closed"
            if self._stopping.is_set():
                break
            self.stats.failed_attempts += 1
            if time.monotonic() - started >= self._stable_after_s:
                self.backoff.reset()
            delay = self.backoff.next_delay()
            refused = reason.startswith("the control plane refused")
            reason = reason.replace(self.url, self.shown_url)  # websockets' InvalidURI names it
            (log.error if refused else log.warning)(
                "Control plane link to %s down (%s); retrying in %.1f s.", self.shown_url, reason, delay
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()

    async def _session(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}"}
        async with connect(
            self.url,
            additional_headers=headers,
            open_timeout=self._open_timeout_s,
            max_size=2**22,
            logger=_WS_LOG,
        ) as ws:
            try:
                # Frames sent while the hello is on its way are held and follow it, so a status
                # change during the handshake is neither lost nor sent before `register`.
                self._held = []
                self._refusal = self._refused = None
                for frame in self._hello():
                    if (text := self._encode(frame)) is not None:
                        await ws.send(text)
                while self._held:
                    if (text := self._encode(self._held.pop(0))) is not None:
                        await ws.send(text)
                self._held = None
                self._ws = ws
                self.stats.connects += 1
                log.info("Connected to the control plane at %s.", self.shown_url)
                await self._serve(ws)
            except ConnectionClosed as exc:
                if self._refused is not None:
                    # `_read` was closing a refused connection when a send saw it closed first.
                    raise RegisterRefused(self._refused) from None
                rcvd = exc.rcvd
                if rcvd is not None and rcvd.code == CLOSE_REGISTER_REFUSED:
                    why = self._refusal or rcvd.reason or "no reason given"
                    raise RegisterRefused(f"{why} (close code {rcvd.code})") from None
                if rcvd is not None and rcvd.code in AUTH_CLOSE_CODES:
                    raise AuthRefused(
                        f"the control plane refused the host token (close code {rcvd.code} {rcvd.reason!r})"
                    ) from None
                raise
            finally:
                self._ws = None
                self._held = None

    async def _serve(self, ws: ClientConnection) -> None:
        tasks = [
            asyncio.create_task(self._read(ws)),
            asyncio.create_task(self._heartbeats(ws)),
            asyncio.create_task(self._flush(ws)),
            asyncio.create_task(self._stopping.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            exc = t.exception()
            if exc is not None:
                raise exc

    async def _read(self, ws: ClientConnection) -> None:
        async for message in ws:
            try:
                frame = loads(message, sender="control_plane")
            except ProtocolError as exc:
                self.stats.rejected_frames += 1
                log.warning("Rejected a malformed frame from the control plane: %s", exc)
                await ws.send(dumps(ErrorFrame("bad_frame", str(exc), exc.field or None)))
                continue
            if isinstance(frame, ErrorFrame) and self._register_refused(frame):
                # Recorded before the close handshake: a heartbeat or telemetry send during it
                # raises ConnectionClosed (code 1000) first, which `_session` turns back into this.
                self._refused = self._refusal or frame.message
                await ws.close()
                raise RegisterRefused(self._refused)
            try:
                await self._on_frame(frame)
            except Exception:
                log.exception("Handling a %r frame failed", frame.TYPE)
        # The iterator ends on a normal close; surface the close code (auth refusals use it).
        raise ws.protocol.close_exc

    def _register_refused(self, frame: ErrorFrame) -> bool:
        """Whether `frame` says the control plane refused this connection's `register` (setting
        `_refusal` to why). Other error frames are kept as the reason, should a `not_registered`
        follow: a control plane that keeps the link after refusing `register` says why first."""
        if frame.code == "register_refused":
            self._refusal = f"{frame.message} [{frame.code}]"
            return True
        if frame.code == "not_registered":
            self._refusal = self._refusal or f"{frame.message} [{frame.code}]"
            return True
        self._refusal = f"{frame.message} [{frame.code}]"
        return False

    async def _heartbeats(self, ws: ClientConnection) -> None:
        while True:
            await ws.send(dumps(Heartbeat(ts=time.time())))
            await asyncio.sleep(self._heartbeat_s)

    async def _flush(self, ws: ClientConnection) -> None:
        while True:
            while self._buffer:
                # Popped before the send: a frame submitted to a full buffer while this one is on
                # its way must push out the oldest frame still waiting, not this one (and then
                # popping after the send would take that waiting frame, never sent nor counted).
                frame = self._buffer.popleft()
                text = self._encode(frame, dropped=self.stats.dropped)
                if text is None:
                    continue
                try:
                    await ws.send(text)
                except BaseException:  # the connection went, or the flush was cancelled, mid-send
                    self._requeue(frame)
                    raise
                self.stats.telemetry_sent += 1
            self._wake.clear()
            await self._wake.wait()

    def _requeue(self, frame: Telemetry) -> None:
        """Put a frame whose send did not finish back first, for the next connection; when the
        buffer filled up meanwhile it is the oldest frame, so it is the one dropped."""
        if len(self._buffer) == self._buffer.maxlen:
            self.stats.dropped += 1
        else:
            self._buffer.appendleft(frame)
