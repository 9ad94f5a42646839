"""`AgentConsumer`: the control plane's end of a GPU agent's websocket (/ws/agent/).

Authentication happens before the handshake completes: the ``Authorization: Bearer <token>``
header must carry a live agent token of some host (inventory's digests), otherwise the socket is
closed before it is accepted and daphne answers the upgrade with HTTP 403, which gpu_agent/link.py
treats as "token refused". A token the database cannot check now (it went away) is no refusal: the
socket is accepted and closed with 4503 (core/websocket_unavailable.py), a dropped link to the
agent. A `register` naming another host than the token's is answered with an
`error` frame and close code 4403 (also a refusal to the agent). A `register` that cannot be stored
(it reports a device another host registered, or the database refuses a value) is answered with a
`register_refused` error frame and close code 4422: the agent logs why and reconnects with backoff,
instead of sending frames that would all be refused as not registered. A `register` that fails
for a passing reason (the database went away, a lock or statement timeout: `OperationalError`,
`InterfaceError`) is no refusal: it is logged here at WARNING, nothing is counted, and the
connection is closed with 4503 (`CLOSE_TRY_AGAIN`; RFC 6455's 1013 "try again later" says the same,
but daphne lets an application close only with 1000 or 3000-4999) and no error frame: the agent
takes that as a dropped link and reconnects with backoff. (Raising would end the connection as
well, daphne closing it with 1011, but daphne logs an "Exception inside application" traceback
for each such database blip.)

One live connection per host: `register` makes a connection the host's current one and only then
joins the host's group (``agent.<host_id>``), which carries desired-list changes and commands. An
older connection of the host is closed with 4409, and a connection whose token is revoked (a new
token was issued) with 4401; both at once through the group within this process, and within
``AGENTS_DESIRED_POLL_S`` for changes made elsewhere (each connection re-checks its session from
its handshake on, registered or not, see `services.session_end`). Only the current connection
marks the link disconnected when it ends.

After `register`, the consumer sends `desired_deployments` (the full list) and re-sends it whenever
it changes: at once when a deployment change in this process signals the host's group, and within
``AGENTS_DESIRED_POLL_S`` for changes made elsewhere (a Celery worker, another ASGI process). Every
frame but `register` and `error` needs a `register` first. Malformed frames (bad JSON, JSON nested
too deeply to decode, a string with NUL, ...) and frames the database refuses are answered with an
`error` frame, counted and logged; the link stays up. A `probe_result` refused so also fails the
probe it names (when its `probe_id` is readable): the profiling worker waiting for it fails now
instead of at its timeout.

However a connection ends (a close, a newer connection, or a handler that raised: daphne then
closes the socket with 1011 without calling `disconnect()`), `_release()` stops its tasks, leaves
the group and marks the link; see `__call__`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError
from inventory.models import Host
from planning.relay import relay_probes, store_probe_result

from agents import services
from agents.ingest import rows_for, writer
from core import ids
from gpu_agent.protocol import (
    CLOSE_REGISTER_REFUSED,
    CLOSE_SUPERSEDED,
    CLOSE_TOKEN_REFUSED,
    CLOSE_TRY_AGAIN,
    DeploymentStatus,
    ErrorFrame,
    Frame,
    Heartbeat,
    LogTail,
    ProbeReport,
    ProtocolError,
    Register,
    Telemetry,
    decode_json,
    dumps,
    parse_frame,
    without_nul,
)

log = logging.getLogger(__name__)

# Why this side closes a connection: close code -> (error frame code, message).
_ENDINGS = {
    CLOSE_TOKEN_REFUSED: ("unauthorized", "the host token was revoked"),
    CLOSE_SUPERSEDED: ("superseded", "a newer connection of this host registered"),
}


class AgentConsumer(AsyncWebsocketConsumer):
    """One agent connection. Thin: parse, authorise, call agents.services / agents.ingest, reply."""

    host: Host | None = None
    linked: services.LinkedHost | None = None
    _token_id: int | None = None  # the AgentToken this connection authenticated with
    _watch: asyncio.Task[None] | None = None  # _watch_session, from accept() on
    _probes: asyncio.Task[None] | None = None  # planning.relay: probes for this host's agent
    _in_group = False
    _released = False
    _closing = False  # `register` was refused or postponed and this side is closing: frames dropped

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' consumer loop, then `_release()` whatever ended it.

        A handler that raises ends the loop without a `websocket.disconnect` message (daphne then
        closes the socket with 1011), so `disconnect()` alone would leave this connection's tasks
        polling forever and the link marked connected.
        """
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def connect(self) -> None:
        self._desired_sent: str | None = None
        self._reported_unknown: set[str] = set()
        token = services.bearer_token(self.scope.get("headers", []))
        record = await database_sync_to_async(services.authenticate)(token)
        if record is None:
            why = "no bearer token" if not token else "unknown or revoked token"
            log.warning("Refused an agent connection from %s: %s.", self.scope.get("client"), why)
            await self.close()  # before accept(): the handshake fails with HTTP 403
            return
        self.host, self._token_id = record.host, record.pk
        await self.accept()
        # From the handshake on, not from `register`: a connection that never registers must close
        # too once its token is revoked, not stay open sending frames that are logged and counted.
        self._watch = asyncio.create_task(self._watch_session(), name=f"agent-watch:{self.host.pk}")

    async def disconnect(self, code: int) -> None:
        if self.host is not None:
            log.info("Agent of %s disconnected (code %s).", self.host.name, code)
        await self._release()

    async def _release(self) -> None:
        """Stop this connection's tasks, leave the host's group, and mark the link disconnected if
        this is still the host's current connection. Runs once, however the connection ended."""
        if self._released or self.host is None:
            return
        self._released = True
        current = asyncio.current_task()
        tasks = [t for t in (self._watch, self._probes) if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._in_group:
                await self.channel_layer.group_discard(services.agent_group(self.host.pk), self.channel_name)
            if self.linked is not None:
                await database_sync_to_async(services.disconnected)(self.linked)
        except Exception:  # never hide what ended the connection behind a clean-up failure
            log.exception("Cleaning up the agent connection of %s failed", self.host.name)

    async def _end(self, code: int) -> None:
        """Close the connection from this side (revoked token, newer connection), cleaned up first."""
        error_code, reason = _ENDINGS[code]
        log.warning("Closing the agent connection of %s: %s.", self._host().name, reason)
        await self._release()
        await self.send_frame(ErrorFrame(error_code, reason))
        await self.close(code=code)

    # ---- incoming -----------------------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch without its per-message ``aclose_old_connections()`` thread hop.

        Channels (>= 4.2) runs ``close_old_connections`` in the sync thread before every handler,
        for consumers that use the ORM without `database_sync_to_async`. Every database access of
        this consumer goes through `database_sync_to_async`, which closes old connections around
        each call itself, so the hop bought nothing here and cost a thread round trip per
        telemetry frame (see benchmarks/telemetry_ingest.py).
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self._released or self._closing:
            return  # this side is closing the connection: frames still in flight are dropped
        if text_data is None:
            await self.reject("", "binary messages are not part of the protocol; send JSON text")
            return
        data: Any = None
        try:
            data = decode_json(text_data)
            frame = parse_frame(data, sender="agent")
        except ProtocolError as exc:
            await self.reject(exc.field, exc.reason)
            if self.linked is not None and isinstance(data, dict) and data.get("type") == ProbeReport.TYPE:
                await self.fail_probe(self.linked, data.get("probe_id"), data.get("deployment_id"), str(exc))
            return
        if isinstance(frame, Register):
            await self.on_register(frame)
            return
        if isinstance(frame, ErrorFrame):
            log.warning("Agent of %s reported: %s (%s)", self._host().name, frame.message, frame.code)
            return
        linked = self.linked
        if linked is None:
            await self.reject("type", f"send `register` before {frame.TYPE}", "not_registered")
        elif isinstance(frame, Telemetry):
            await self.on_telemetry(linked, frame)
        elif isinstance(frame, Heartbeat):
            await database_sync_to_async(services.heartbeat)(linked.host_id)
        elif isinstance(frame, DeploymentStatus):
            await self.on_status(linked, frame)
        elif isinstance(frame, LogTail):
            await self.on_log_tail(linked, frame)
        elif isinstance(frame, ProbeReport):
            await self.on_probe_result(linked, frame)

    async def on_register(self, frame: Register) -> None:
        host = self._host()
        try:
            linked = await database_sync_to_async(services.register)(host, frame, token_id=self._token_id)
        except services.RegistrationRefused as exc:
            log.warning("Refused the agent of %s: %s.", host.name, exc)
            self._closing = True
            await self.send_frame(ErrorFrame(exc.code, without_nul(str(exc)), exc.field))
            await self.close(code=exc.close_code)
            return
        except IntegrityError as exc:  # e.g. another host registered a device uuid meanwhile
            await self.refuse_register("devices", f"cannot store the devices: {exc}")
            return
        except (OperationalError, InterfaceError) as exc:
            # Passing (the database went away, a lock or statement timeout): a refusal would have the
            # agent report this agent's register as refused. The agent retries with backoff.
            log.warning(
                "Could not store the register of the agent of %s now; closing the connection (%d) "
                "for the agent to retry: %s",
                host.name,
                CLOSE_TRY_AGAIN,
                exc,
            )
            self._closing = True
            await self.close(code=CLOSE_TRY_AGAIN)
            return
        except DatabaseError as exc:  # e.g. a value beyond a column's range; nothing was stored
            await self.refuse_register("", f"cannot store the registration: {exc}")
            return
        self.linked = linked
        group = services.agent_group(host.pk)
        # Older connections of the host in this process close at once; others see it when they poll.
        await self.channel_layer.group_send(group, {"type": "agent.superseded", "by": self.channel_name})
        if not self._in_group:
            await self.channel_layer.group_add(group, self.channel_name)
            self._in_group = True
        log.info(
            "Agent %s of %s registered %d device(s).", frame.agent_version, host.name, len(frame.devices)
        )
        await self.push_desired(force=True)
        if self._probes is None:
            self._probes = asyncio.create_task(relay_probes(host.pk, self._send_json_frame))

    async def refuse_register(self, field: str, reason: str) -> None:
        """Answer a `register` the database refused (nothing was stored) with a `register_refused`
        error and close with `CLOSE_REGISTER_REFUSED`: every later frame of the connection would be
        refused as not registered, so the agent reconnects with backoff instead."""
        host = self._host()
        reason = without_nul(reason)  # a database error may quote the value
        log.warning("Refused the register of the agent of %s: %s", host.name, reason)
        self._closing = True
        await database_sync_to_async(services.count_rejected)(host.pk)
        await self.send_frame(ErrorFrame("register_refused", reason, without_nul(field) or None))
        await self.close(code=CLOSE_REGISTER_REFUSED)

    async def on_telemetry(self, linked: services.LinkedHost, frame: Telemetry) -> None:
        stored = rows_for(linked, frame)  # no database access: cheap enough for the event loop
        await writer().submit(stored)
        for index in stored.unknown_devices:
            await self.reject_once(f"device:{index}", "devices", f"device index {index} was not registered")
        for dep in stored.unknown_deployments:
            if not ids.is_digits(dep):
                # Engines the control plane did not place (a simulated host's built-in "sim:<device>"
                # engines) have no deployment to store under; nothing is wrong.
                continue
            await self.reject_once(
                f"deployment:{dep}", "engines", f"deployment {dep!r} is not on host {linked.name}"
            )

    async def on_status(self, linked: services.LinkedHost, frame: DeploymentStatus) -> None:
        try:
            await database_sync_to_async(services.report_status)(linked, frame)
        except services.UnknownDeployment as exc:
            await self.reject("deployment_id", str(exc), "unknown_deployment")
        except DatabaseError as exc:  # a value beyond a column's range; nothing was stored
            await self.reject("", f"cannot store the status: {exc}")

    async def on_log_tail(self, linked: services.LinkedHost, frame: LogTail) -> None:
        """Relay to whoever asked: dashboard sockets in group ``agents.logs.<deployment id>``. Only
        for the host's own deployments: an agent must not write into another host's log view.

        The group is named after the deployment's key, not the wire id as written: an id with
        leading zeros names the same deployment (`services.wire_pk`), and as a group name it would
        reach no socket, or raise past channels' 100 characters and end the link."""
        dep = frame.deployment_id
        if not await database_sync_to_async(services.is_host_deployment)(linked, dep):
            reason = f"deployment {dep!r} is not on host {linked.name}"
            await self.reject("deployment_id", reason, "unknown_deployment")
            return
        pk = services.wire_pk(dep)
        await self.channel_layer.group_send(
            f"agents.logs.{pk}", {"type": "log.tail", "deployment_id": str(pk), "lines": frame.lines}
        )

    async def on_probe_result(self, linked: services.LinkedHost, frame: ProbeReport) -> None:
        try:
            stored = await database_sync_to_async(store_probe_result)(linked.host_id, frame)
        except DatabaseError as exc:  # a value the database refuses; nothing was stored
            await self.reject("", f"cannot store the probe result: {exc}")
            await self.fail_probe(linked, frame.probe_id, frame.deployment_id, f"cannot store it: {exc}")
            return
        if not stored:
            log.warning("Agent of %s answered unknown probe %s", linked.name, frame.probe_id)

    async def fail_probe(
        self, linked: services.LinkedHost, probe_id: Any, deployment_id: Any, why: str
    ) -> None:
        """Fail the open probe ``probe_id`` of the host, whose `probe_result` was refused (``why``):
        its profiling worker polls the probe's row and would otherwise wait out the probe's timeout
        (ten minutes by default) for an answer that has come. Nothing to do when the id cannot be
        one this control plane issued (not a string, empty, or holding NUL or a lone surrogate, which
        no database can even be asked for: UnicodeEncodeError): no probe matches it."""
        if not isinstance(probe_id, str) or not probe_id or without_nul(probe_id) != probe_id:
            return
        dep = deployment_id if isinstance(deployment_id, str) else ""
        reason = f"the control plane refused the agent's probe_result: {why}"
        report = ProbeReport(
            probe_id=probe_id, deployment_id=without_nul(dep), ok=False, error=without_nul(reason)
        )
        try:
            if await database_sync_to_async(store_probe_result)(linked.host_id, report):
                log.warning("Failed probe %s of %s: its answer was refused.", probe_id, linked.name)
        except DatabaseError:
            log.exception("Failing probe %s of %s after a refused answer failed", probe_id, linked.name)

    async def reject(self, field: str, reason: str, code: str = "bad_frame") -> None:
        """Answer a frame we cannot accept with an `error` frame; the link stays up."""
        host = self._host()
        log.warning("Rejected a frame from the agent of %s: %s: %s", host.name, field or "frame", reason)
        await database_sync_to_async(services.count_rejected)(host.pk)
        # Never a NUL back (a database error may quote the value): the agent would refuse the frame.
        await self.send_frame(ErrorFrame(code, without_nul(reason), without_nul(field) or None))

    async def reject_once(self, key: str, field: str, reason: str) -> None:
        """Like `reject`, once per connection for a repeated problem (e.g. in every telemetry tick)."""
        if key not in self._reported_unknown:
            self._reported_unknown.add(key)
            await self.reject(field, reason, "unknown_" + key.split(":")[0])

    # ---- outgoing -----------------------------------------------------------------------------

    async def send_frame(self, frame: Frame) -> None:
        await self.send(text_data=dumps(frame))

    async def _send_json_frame(self, frame: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(frame))

    async def push_desired(self, force: bool = False) -> None:
        """Send `desired_deployments` if it differs from what this connection sent last."""
        if self.linked is None or self._released:
            return
        frame = await database_sync_to_async(services.desired_deployments)(self.linked)
        text = dumps(frame)
        if force or text != self._desired_sent:
            self._desired_sent = text
            await self.send(text_data=text)

    async def _watch_session(self) -> None:
        """Every ``AGENTS_DESIRED_POLL_S``: close the connection if its token was revoked or a newer
        connection of the host registered, else re-send the desired list if it changed. This is
        how changes made in other processes (a Celery worker, `manage.py register_host`, another
        ASGI process) reach the connection, and how a connection that has not registered (so is
        in no group) learns of a revocation at all."""
        assert self._token_id is not None, "started once the connection is accepted"
        while True:
            await asyncio.sleep(settings.AGENTS_DESIRED_POLL_S)
            if self._closing:
                return  # a refused or postponed `register` is closing it already
            try:
                code = await database_sync_to_async(services.session_end)(self._token_id, self.linked)
                if code is not None:
                    await self._end(code)
                    return
                await self.push_desired()
            except Exception:
                log.exception("Re-checking the agent connection of %s failed", self._host().name)

    # Channel-layer messages sent to the group agent.<host_id> (agents.services).
    async def desired_changed(self, event: dict[str, Any]) -> None:
        await self.push_desired()

    async def agent_command(self, event: dict[str, Any]) -> None:
        if not self._released:
            await self.send(text_data=json.dumps(event["frame"]))

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        """Another connection of this host registered (in this process): it takes over."""
        if event["by"] != self.channel_name and not self._released:
            await self._end(CLOSE_SUPERSEDED)

    async def agent_revoked(self, event: dict[str, Any]) -> None:
        """Agent tokens of this host were revoked: close if this connection used one of them."""
        if self._token_id in event["token_ids"] and not self._released:
            await self._end(CLOSE_TOKEN_REFUSED)

    def _host(self) -> Host:
        assert self.host is not None, "frames arrive only on accepted connections"
        return self.host
