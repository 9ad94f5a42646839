"""Dashboard websockets: live host map, jobs, a model's engine metrics, a deployment's log tail.

Why polling: job progress is written by Celery workers and telemetry by whichever ASGI process
holds an agent's link. With Channels' in-memory layer (the embedded default) those processes
cannot ``group_send`` to this one, so each socket re-reads the database itself and sends only what
changed. That works the same with channels_redis. A ``dashboard.changed`` message on the stream's
group (``stream_group``: ``dashboard.<stream>``) wakes the sockets at once instead of at their next
tick; nothing in the platform sends one yet (the tests do), so today the tick paces every update.
Either way a series is pushed at most once per ``push_interval_s()`` (1 Hz).

Frames sent (JSON): ``{"type": "snapshot", "data": {key: value}}`` once, then
``{"type": "delta", "set": {key: value}, "remove": [key]}``; the model socket sends
``{"type": "points", "deployment": id, "points": [...]}`` with new samples only, and the log
socket ``{"type": "log", "deployment": id, "lines": [...]}``.

Access is checked at the handshake (a platform role, from the session) and again every
``DASHBOARD_AUTH_RECHECK_S`` (5 s) while the socket is open, from a fresh read of the session and
the user: a socket whose session is gone (signed out, expired, flushed) or whose user lost access
(deactivated, role removed, password changed) leaves its groups, sends nothing more and is closed
with 4401 (``CLOSE_ACCESS_REVOKED``). One check per socket per period, not one per pushed message.
A user holds at most DASHBOARD_SOCKETS_PER_USER of these sockets open at once (all streams
together); one more is accepted and closed at once with 4429 (``CLOSE_TOO_MANY_SOCKETS``), before it
reads anything (dashboard/socket_slots.py says where the count is kept).
A log socket whose deployment, or a model socket whose model, is deleted while it is open is
closed the same way with 4404 (``CLOSE_GONE``): the log socket would otherwise ask the host's agent
for the tail of a deployment it no longer has every second, and the model page would stay "live" on
a model that is gone, for as long as the page stays open.

The sockets only push: whatever a browser sends is ignored. A socket's polling task and groups are
released however it ends, including when a handler raises (daphne then closes it with 1011 and
`disconnect()` is never called), and so is its place among its user's open sockets; see
`LiveConsumer.__call__`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from importlib import import_module
from typing import Any
from urllib.parse import parse_qs

from accounts.models import User
from accounts.roles import role_of
from agents.services import agent_group
from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from deployments.models import Deployment
from django.conf import settings
from django.utils import timezone
from jobs.models import Job
from registry.models import ServedModel

from core import ids
from dashboard import snapshots, socket_slots
from dashboard.deltas import Throttle, diff, push_interval_s
from dashboard.socket_slots import CLOSE_TOO_MANY_SOCKETS
from gpu_agent.protocol import Command

log = logging.getLogger(__name__)

# Engine points kept per deployment for the model page's summary (attainment over these windows).
SUMMARY_WINDOWS = 60

# Close code of a socket whose user lost access while it was open: 401's, as the agent socket's for a
# revoked token (gpu_agent.protocol.CLOSE_TOKEN_REFUSED).
CLOSE_ACCESS_REVOKED = 4401
# Close code of a socket whose subject was deleted while it was open: 404's. live.js says the subject
# is gone and does not reconnect (the handshake would be refused).
CLOSE_GONE = 4404


def stream_group(stream: str) -> str:
    return f"dashboard.{stream}"


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Base: refuses sockets without a platform role, then runs ``tick()`` at most once a second."""

    stream = ""
    _loop: asyncio.Task[None] | None = None  # _run, from accept() on
    _ended = False  # this side closed the socket (access lost, subject gone): nothing more is sent
    _slot: socket_slots.Slot | None = None  # its place among its user's open sockets, from connect()
    _renewal: asyncio.Future[None] | None = None  # the slot's last lease renewal (_renew_slot)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' consumer loop, then `_release()` whatever ended it: a handler that raises ends
        the loop without `disconnect()`, which would leave `_run` reading the database every
        second for a socket that is gone, and its slot taken for ever."""
        self._groups: list[str] = []  # channel-layer groups joined, left by _release()
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def connect(self) -> None:
        user = self.scope.get("user")
        if role_of(user) is None:
            await self.close()  # before accept(): the handshake is answered with HTTP 403
            return
        self._user_pk = user.pk
        self._slot = await socket_slots.take(user.pk)
        if self._slot is None:  # accepted, to tell live.js why with a close code
            log.warning(
                "Refused a dashboard stream %s of user %s: %s sockets open (DASHBOARD_SOCKETS_PER_USER).",
                self.stream or type(self).__name__,
                user.pk,
                settings.DASHBOARD_SOCKETS_PER_USER,
            )
            self._ended = True
            await self.accept()
            await self.close(code=CLOSE_TOO_MANY_SOCKETS)
            return
        self._renew_at = time.monotonic() + socket_slots.RENEW_S
        self._recheck_at = time.monotonic() + float(settings.DASHBOARD_AUTH_RECHECK_S)
        self._wake = asyncio.Event()
        self._throttle = Throttle(interval_s=push_interval_s())
        if not await self.prepare():
            await self.close()
            return
        await self.accept()
        if self.stream:
            await self.join(stream_group(self.stream))
        await self.start()
        if self._ended:  # start() found the subject gone
            return
        self._loop = asyncio.create_task(self._run(), name=f"dashboard:{type(self).__name__}")

    async def disconnect(self, code: int) -> None:
        await self._release()

    async def send_json(self, content: Any, close: bool = False) -> None:
        """Send, unless the user lost access: a group message (a log tail) may still arrive between
        the close and the end of the socket. Every push of these sockets goes through here."""
        if not self._ended:
            await super().send_json(content, close)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Browsers send nothing on these sockets; anything that arrives is dropped, so a stray or
        hostile message can neither break the socket nor reach a handler."""
        log.debug("Ignored a client message on dashboard stream %s", self.stream or type(self).__name__)

    async def join(self, group: str) -> None:
        """Join a channel-layer group for the socket's life."""
        await self.channel_layer.group_add(group, self.channel_name)
        self._groups.append(group)

    async def _release(self) -> None:
        """Stop the polling task, leave every group joined and give the socket's slot back; safe to
        call more than once."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        await self._leave_groups()
        slot, self._slot = self._slot, None
        if slot is not None:
            # A renewal runs on in its thread when the loop is cancelled: freed before it ends, the
            # slot would be written back, taken for LEASE_S by a socket that is gone.
            if self._renewal is not None:
                with contextlib.suppress(Exception):
                    await self._renewal
            try:
                await socket_slots.give_back(slot)
            except Exception:  # never hide what ended the socket behind a clean-up failure
                log.exception("Freeing the slot of a dashboard socket of user %s failed", slot.user_pk)

    async def _leave_groups(self) -> None:
        groups, self._groups = self._groups, []
        try:
            for group in groups:
                await self.channel_layer.group_discard(group, self.channel_name)
        except Exception:  # never hide what ended the socket behind a clean-up failure
            log.exception(
                "Leaving the groups of dashboard stream %s failed", self.stream or type(self).__name__
            )

    async def prepare(self) -> bool:
        """Called before accepting: parse the URL, look up the object; False refuses the socket."""
        return True

    async def start(self) -> None:
        """Called once after accepting: send the first full state."""

    async def tick(self) -> None:
        """Called at most once per interval: send what changed since the last call."""

    async def _run(self) -> None:
        interval = self._throttle.interval_s
        last = time.monotonic()
        while not self._ended:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            wait = interval - (time.monotonic() - last)
            if wait > 0:
                await asyncio.sleep(wait)
            last = time.monotonic()
            await self._renew_slot()
            if await self._access_lost():
                await self._revoke()
                return
            try:
                await self.tick()
            except Exception:
                log.exception("Dashboard stream %s failed a tick", self.stream or type(self).__name__)

    async def _renew_slot(self) -> None:
        """Renew the socket's slot when due (every ``socket_slots.RENEW_S``); a failure is logged
        and tried again then (a lease outlasts a few renewals)."""
        slot = self._slot
        if slot is None or time.monotonic() < self._renew_at:
            return
        self._renew_at = time.monotonic() + socket_slots.RENEW_S
        self._renewal = asyncio.ensure_future(socket_slots.renew(slot))
        try:
            await asyncio.shield(self._renewal)  # see _release
        except Exception:
            log.exception("Renewing the slot of a dashboard socket of user %s failed", slot.user_pk)

    async def _access_lost(self) -> bool:
        """Whether a re-check, when one is due (every ``DASHBOARD_AUTH_RECHECK_S``, checked before a
        tick so nothing is pushed past it), finds the user without access. A check that fails (the
        database is away) is logged and tried again before the next tick; the socket stays."""
        if time.monotonic() < self._recheck_at:
            return False
        try:
            allowed = await self._still_allowed()
        except Exception:
            log.exception(
                "Re-checking the user of dashboard stream %s failed", self.stream or type(self).__name__
            )
            return False
        self._recheck_at = time.monotonic() + float(settings.DASHBOARD_AUTH_RECHECK_S)
        return not allowed

    async def _still_allowed(self) -> bool:
        """Whether the socket's user still has a platform role, read afresh. With a session (the browser
        stack's sockets): from a new read of the session, as at the handshake (channels' `get_user`),
        so a deleted, expired or flushed session, or a changed password, counts. Without one (a user
        put in the scope directly): from the user's row."""
        session = self.scope.get("session")
        if session is None:
            user: Any = await database_sync_to_async(User.objects.filter(pk=self._user_pk).first)()
        else:
            key = session.session_key
            if not key:
                return False
            fresh = import_module(settings.SESSION_ENGINE).SessionStore(key)  # read on first use
            user = await get_user({"session": fresh})
        return user is not None and user.pk == self._user_pk and role_of(user) is not None

    async def _revoke(self) -> None:
        """The user lost access: close with 4401."""
        await self.end(CLOSE_ACCESS_REVOKED, "access revoked")

    async def end(self, code: int, why: str) -> None:
        """Close the socket from this side: leave the groups, stop ticking, send nothing more."""
        log.info(
            "Closing dashboard stream %s of user %s: %s.",
            self.stream or type(self).__name__,
            self._user_pk,
            why,
        )
        self._ended = True
        await self._leave_groups()
        await self.close(code=code)

    async def dashboard_changed(self, event: dict[str, Any]) -> None:
        """Group message: something changed; push at the next allowed moment."""
        self._wake.set()


class SnapshotConsumer(LiveConsumer):
    """A keyed snapshot (snapshots.Snapshot) pushed as deltas."""

    async def read(self) -> snapshots.Snapshot:
        raise NotImplementedError

    async def start(self) -> None:
        self._sent = await self.read()
        await self.send_json({"type": "snapshot", "data": self._sent})

    async def tick(self) -> None:
        current = await self.read()
        change = diff(self._sent, current)
        if change is not None:
            self._sent = current
            await self.send_json({"type": "delta", **change})


class OverviewConsumer(SnapshotConsumer):
    """``/ws/dashboard/overview/``: every host and GPU card."""

    stream = "overview"

    async def read(self) -> snapshots.Snapshot:
        return await database_sync_to_async(snapshots.overview)()


class JobsConsumer(SnapshotConsumer):
    """``/ws/dashboard/jobs/``: the newest jobs' status and progress. ``?through=<pk>``: the jobs of a
    page of older jobs instead, the newest ``JOBS_SHOWN`` up to that one (job_pages), so that the
    page never hears of newer jobs; a ``through`` that is not a job id refuses the socket."""

    stream = "jobs"
    through: int | None = None

    async def prepare(self) -> bool:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        values = query.get("through")
        if values is None:
            return True
        self.through = ids.parse_pk(values[0]) if len(values) == 1 else None
        return self.through is not None

    async def read(self) -> snapshots.Snapshot:
        return await database_sync_to_async(snapshots.jobs)(self.through)


class JobConsumer(SnapshotConsumer):
    """``/ws/dashboard/jobs/<pk>/``: one job, for its page. The jobs stream carries only the newest
    ``JOBS_SHOWN``: an older job still queued or running would never update there."""

    stream = "jobs"

    async def prepare(self) -> bool:
        self.job_pk = int(self.scope["url_route"]["kwargs"]["pk"])
        return bool(await database_sync_to_async(Job.objects.filter(pk=self.job_pk).exists)())

    async def read(self) -> snapshots.Snapshot:
        return await database_sync_to_async(snapshots.job)(self.job_pk)


class ModelConsumer(LiveConsumer):
    """``/ws/dashboard/models/<pk>/``: new engine samples of the model's deployments, and a summary."""

    async def prepare(self) -> bool:
        pk = self.scope["url_route"]["kwargs"]["pk"]
        self.model = await database_sync_to_async(ServedModel.objects.filter(pk=pk).first)()
        return self.model is not None

    async def start(self) -> None:
        self._after: dict[int, Any] = {}
        self._recent: dict[int, list[dict[str, Any]]] = {}
        self._summary: dict[str, Any] = {}
        self._states: dict[str, str] = {}
        await self.tick()

    def _read_new(self) -> dict[int, list[dict[str, Any]]] | None:
        """deployment pk -> its new points; None once the model is deleted. Also reads the
        deployments' states into ``self._states`` (str pk -> the state the page shows)."""
        rows = list(
            Deployment.objects.filter(model=self.model)
            .order_by("pk")
            .values_list("pk", "observed_state", "desired_state")
        )
        deps = [pk for pk, _, _ in rows]
        # Deployments protect their model: only a model without any can have been deleted.
        if not deps and not ServedModel.objects.filter(pk=self.model.pk).exists():
            return None
        self._states = {str(pk): snapshots.deployment_state(obs, want) for pk, obs, want in rows}
        # First read: only the recent past (the page drew the history from the same samples).
        start = timezone.now() - snapshots.HISTORY_WINDOW
        after = {pk: self._after.get(pk, start) for pk in deps}
        read = snapshots.engine_points(after, {pk: pk in self._after for pk in deps})
        out = {}
        for pk, (points, newest) in read.items():
            out[pk] = points
            if points or pk in self._after:
                self._after[pk] = newest
        return out

    async def tick(self) -> None:
        new = await database_sync_to_async(self._read_new)()
        if new is None:
            await self.end(CLOSE_GONE, f"model {self.model.pk} was deleted")
            return
        for pk, points in new.items():
            if not points:
                continue
            await self.send_json({"type": "points", "deployment": pk, "points": points})
            self._recent[pk] = (self._recent.get(pk, []) + points)[-SUMMARY_WINDOWS:]
        recent = [p for points in self._recent.values() for p in points]
        summary = {
            "attainment": snapshots.attainment(self.model, recent),
            "windows": len(recent),
            "deployments": self._states,  # their states, which the page shows as they change
        }
        change = diff(self._summary, summary)
        if change is not None:
            self._summary = summary
            await self.send_json({"type": "summary", **change})


class LogConsumer(LiveConsumer):
    """``/ws/dashboard/deployments/<pk>/logs/``: asks the host's agent for the engine log tail.

    The agent answers a ``tail_log`` command with a ``log_tail`` frame, which agents/consumers.py
    relays to the group ``agents.logs.<deployment pk>``; this socket joins that group.
    """

    LINES = 200

    async def prepare(self) -> bool:
        pk = self.scope["url_route"]["kwargs"]["pk"]
        self.deployment = await database_sync_to_async(Deployment.objects.filter(pk=pk).first)()
        return self.deployment is not None

    async def start(self) -> None:
        self._lines: list[str] | None = None
        await self.join(f"agents.logs.{self.deployment.pk}")
        await self.tick()

    async def tick(self) -> None:
        pk = self.deployment.pk
        if not await database_sync_to_async(Deployment.objects.filter(pk=pk).exists)():
            await self.end(CLOSE_GONE, f"deployment {pk} was deleted")
            return
        command = Command(uuid.uuid4().hex, "tail_log", str(pk), lines=self.LINES)
        await self.channel_layer.group_send(
            agent_group(self.deployment.host_id), {"type": "agent.command", "frame": command.to_dict()}
        )

    async def log_tail(self, event: dict[str, Any]) -> None:
        lines = list(event["lines"])
        if lines != self._lines and self._throttle.ready("log"):
            self._lines = lines
            await self.send_json({"type": "log", "deployment": self.deployment.pk, "lines": lines})
