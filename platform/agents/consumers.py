"""`AgentConsumer`: the control plane's end of a GPU agent's websocket (/ws/agent/).

Authentication happens before the handshake completes: the ``Authorization: Bearer <token>``
header must carry a live agent token of some host (inventory's digests), otherwise the socket is
closed before it is accepted and daphne answers the upgrade with HTTP 403, which gpu_agent/link.py
treats as "token refused". A `register` naming another host than the token's is answered with an
`error` frame and close code 4403 (also a refusal to the agent).

After `register`, the consumer sends `desired_deployments` (the full list) and re-sends it whenever
it changes: at once when a deployment change in this process signals the host's group
(``agent.<host_id>``), and within ``AGENTS_DESIRED_POLL_S`` for changes made elsewhere (a Celery
worker, another ASGI process). Malformed frames are answered with an `error` frame, counted and
logged; the link stays up.
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
from django.db import IntegrityError
from inventory.models import Host
from planning.relay import relay_probes, store_probe_result

from agents import services, sweeper
from agents.ingest import rows_for, writer
from gpu_agent.protocol import (
    DeploymentStatus,
    ErrorFrame,
    Frame,
    Heartbeat,
    LogTail,
    ProbeReport,
    ProtocolError,
    Register,
    Telemetry,
    dumps,
    loads,
)

log = logging.getLogger(__name__)

CLOSE_REFUSED = 4403


class AgentConsumer(AsyncWebsocketConsumer):
    """One agent connection. Thin: parse, authorise, call agents.services / agents.ingest, reply."""

    host: Host | None = None
    linked: services.LinkedHost | None = None

    async def connect(self) -> None:
        self._desired_sent: str | None = None
        self._poll: asyncio.Task[None] | None = None
        self._probes: asyncio.Task[None] | None = None  # planning.relay: probes for this host's agent
        self._reported_unknown: set[str] = set()
        token = services.bearer_token(self.scope.get("headers", []))
        host = await database_sync_to_async(services.authenticate)(token)
        if host is None:
            why = "no bearer token" if not token else "unknown or revoked token"
            log.warning("Refused an agent connection from %s: %s.", self.scope.get("client"), why)
            await self.close()  # before accept(): the handshake fails with HTTP 403
            return
        self.host = host
        await self.accept()
        await self.channel_layer.group_add(services.agent_group(host.pk), self.channel_name)
        sweeper.ensure_started()

    async def disconnect(self, code: int) -> None:
        if self.host is None:
            return
        if self._poll is not None:
            self._poll.cancel()
        if self._probes is not None:
            self._probes.cancel()
        await self.channel_layer.group_discard(services.agent_group(self.host.pk), self.channel_name)
        await database_sync_to_async(services.disconnected)(self.host.pk)
        log.info("Agent of %s disconnected (code %s).", self.host.name, code)

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
        if text_data is None:
            await self.reject("", "binary messages are not part of the protocol; send JSON text")
            return
        try:
            frame = loads(text_data, sender="agent")
        except ProtocolError as exc:
            await self.reject(exc.field, exc.reason)
            return
        if isinstance(frame, Telemetry):
            await self.on_telemetry(frame)
        elif isinstance(frame, Heartbeat):
            await database_sync_to_async(services.heartbeat)(self._host().pk)
        elif isinstance(frame, Register):
            await self.on_register(frame)
        elif isinstance(frame, DeploymentStatus):
            await self.on_status(frame)
        elif isinstance(frame, LogTail):
            await self.on_log_tail(frame)
        elif isinstance(frame, ProbeReport):
            if not await database_sync_to_async(store_probe_result)(self._host().pk, frame):
                log.warning("Agent of %s answered unknown probe %s", self._host().name, frame.probe_id)
        elif isinstance(frame, ErrorFrame):
            log.warning("Agent of %s reported: %s (%s)", self._host().name, frame.message, frame.code)

    async def on_register(self, frame: Register) -> None:
        host = self._host()
        try:
            self.linked = await database_sync_to_async(services.register)(host, frame)
        except services.RegistrationRefused as exc:
            log.warning("Refused the agent of %s: %s.", host.name, exc)
            await self.send_frame(ErrorFrame("unauthorized", str(exc), "host"))
            await self.close(code=CLOSE_REFUSED)
            return
        except IntegrityError as exc:
            await self.reject("devices", f"cannot store the devices: {exc}")
            return
        log.info(
            "Agent %s of %s registered %d device(s).", frame.agent_version, host.name, len(frame.devices)
        )
        await self.push_desired(force=True)
        if self._poll is None:
            self._poll = asyncio.create_task(self._poll_desired())
        if self._probes is None:
            self._probes = asyncio.create_task(relay_probes(host.pk, self._send_json_frame))

    async def on_telemetry(self, frame: Telemetry) -> None:
        linked = self.linked
        if linked is None:
            await self.reject("type", "send `register` before telemetry", "not_registered")
            return
        stored = rows_for(linked, frame)  # no database access: cheap enough for the event loop
        await writer().submit(stored)
        for index in stored.unknown_devices:
            await self.reject_once(f"device:{index}", "devices", f"device index {index} was not registered")
        for dep in stored.unknown_deployments:
            if not (dep.isascii() and dep.isdigit()):
                # Engines the control plane did not place (a simulated host's built-in "sim:<device>"
                # engines) have no deployment to store under; nothing is wrong.
                continue
            await self.reject_once(
                f"deployment:{dep}", "engines", f"deployment {dep!r} is not on host {linked.name}"
            )

    async def on_status(self, frame: DeploymentStatus) -> None:
        linked = self.linked
        if linked is None:
            await self.reject("type", "send `register` before deployment_status", "not_registered")
            return
        try:
            await database_sync_to_async(services.report_status)(linked, frame)
        except services.UnknownDeployment as exc:
            await self.reject("deployment_id", str(exc), "unknown_deployment")

    async def on_log_tail(self, frame: LogTail) -> None:
        # Relayed to whoever asked (a dashboard socket in group agents.logs.<deployment id>).
        if frame.deployment_id.isascii() and frame.deployment_id.isdigit():
            await self.channel_layer.group_send(
                f"agents.logs.{frame.deployment_id}",
                {"type": "log.tail", "deployment_id": frame.deployment_id, "lines": frame.lines},
            )

    async def reject(self, field: str, reason: str, code: str = "bad_frame") -> None:
        """Answer a frame we cannot accept with an `error` frame; the link stays up."""
        host = self._host()
        log.warning("Rejected a frame from the agent of %s: %s: %s", host.name, field or "frame", reason)
        await database_sync_to_async(services.count_rejected)(host.pk)
        await self.send_frame(ErrorFrame(code, reason, field or None))

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
        if self.linked is None:
            return
        frame = await database_sync_to_async(services.desired_deployments)(self.linked)
        text = dumps(frame)
        if force or text != self._desired_sent:
            self._desired_sent = text
            await self.send(text_data=text)

    async def _poll_desired(self) -> None:
        while True:
            await asyncio.sleep(settings.AGENTS_DESIRED_POLL_S)
            try:
                await self.push_desired()
            except Exception:
                log.exception("Re-reading the desired deployments of %s failed", self._host().name)

    # Channel-layer messages sent to the group agent.<host_id> (agents.services).
    async def desired_changed(self, event: dict[str, Any]) -> None:
        await self.push_desired()

    async def agent_command(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(event["frame"]))

    def _host(self) -> Host:
        assert self.host is not None, "frames arrive only on accepted connections"
        return self.host
