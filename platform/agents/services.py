"""Agent link operations: authenticate, register, liveness, deployment reports, desired state.

The consumer (agents/consumers.py) parses frames with ``gpu_agent.protocol`` and calls these; every
function here is synchronous ORM code (the consumer wraps it in ``database_sync_to_async``), except
the ``notify_*``/``send_command`` helpers, which post to a host's channel-layer group.

One live connection per host: the connection that registered last is the host's current one.
``AgentLink.connected_at`` is its registration time, and doubles as its identity: an older
connection sees a newer time (`session_end`) and is closed, and only the current connection may
mark the link disconnected (`disconnected`). Channel-layer messages close the older one at once
within a process; the time check, polled by every connection, reaches other processes too.

Each `register` also starts a new agent *run* (``AgentLink.run``, a counter): the agent re-sends
every status after `register`, so a run's first status of a deployment is the agent's current word
whatever its clock says, and a status of an older run is stale (`report_status`).

Wire identifiers: a deployment's id on the wire is ``str(Deployment.pk)``; devices are named by
their host-local ``index``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from deployments.engine_keys import engine_api_key
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import report_observed_state
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from inventory.models import AgentToken, Device, DeviceKind, Host, lock_devices_for_delete
from inventory.services import agent_token_is_live, live_agent_token, mark_seen

from agents import reconcile
from agents.models import AgentLink, Replica
from core import ids
from gpu_agent.protocol import (
    CLOSE_REGISTER_REFUSED,
    CLOSE_SUPERSEDED,
    CLOSE_TOKEN_REFUSED,
    CLOSE_WRONG_HOST,
    DeploymentSpec,
    DeploymentStatus,
    DesiredDeployments,
    ModelSpec,
    Register,
)

log = logging.getLogger(__name__)


class RegistrationRefused(Exception):
    """The agent may not register: `register` names another host than the token's, the token was
    revoked since the socket was accepted, or it reports a device another host registered.
    ``close_code`` is the code to close the link with; ``code`` and ``field`` those of the `error`
    frame sent before."""

    def __init__(
        self,
        message: str,
        close_code: int = CLOSE_WRONG_HOST,
        code: str = "unauthorized",
        field: str = "host",
    ) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.code = code
        self.field = field


class UnknownDeployment(Exception):
    """A frame names a deployment that is not on the agent's host."""


@dataclass
class LinkedHost:
    """What a connection knows about its host after `register` (cached for the link's life)."""

    host_id: int
    name: str
    address: str
    simulated: bool
    device_ids: dict[int, int]  # device index -> Device pk
    deployment_ids: set[int] = field(default_factory=set)  # this host's deployment pks (refreshed on miss)
    dropped: int = 0  # the agent's cumulative dropped-telemetry counter, as last stored
    link_touched_at: float = 0.0  # monotonic time AgentLink.last_telemetry_at was last written
    connected_at: datetime | None = None  # this connection's registration (AgentLink.connected_at)
    run: int = 0  # this connection's agent run (AgentLink.run): orders its statuses against others'


def wire_pk(wire_id: str) -> int | None:
    """The primary key a wire deployment id stands for, or None when it cannot be one of ours (not
    decimal digits, or too long for a 64-bit key: such a number would overflow the database
    driver, and a long enough one even ``int()``)."""
    return ids.parse_pk(wire_id)


def agent_group(host_id: int) -> str:
    """The channel-layer group of a host's agent connection(s)."""
    return f"agent.{host_id}"


def authenticate(token: str) -> AgentToken | None:
    """The live agent token with this plaintext (inventory's digests), with its host, else None."""
    return live_agent_token(token) if token else None


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str:
    """The token of an ``Authorization: Bearer <token>`` header in an ASGI scope, or ""."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


@transaction.atomic
def register(
    host: Host, frame: Register, now: datetime | None = None, *, token_id: int | None = None
) -> LinkedHost:
    """Record the agent's host (address, heartbeat interval: liveness waits for a few missed beats
    of it) and devices (upsert by device index) and mark the host online.

    Devices the agent no longer reports are deleted unless a deployment still uses them (then they
    are kept, so the operator sees the deployment fail instead of silently losing its devices).
    Observed states the restarted agent will not report are settled (`reconcile.registered`).
    The returned ``connected_at`` makes the calling connection the host's current one.

    Raises:
        RegistrationRefused: the frame names another host than the token's, the token the
            connection authenticated with (``token_id``) is no longer live, or the frame reports a
            device (by uuid) that another host registered; nothing is stored.
    """
    now = now or timezone.now()
    if frame.host != host.name:
        raise RegistrationRefused(
            f"this token belongs to host {host.name!r}, but the agent registered as {frame.host!r}"
        )
    if token_id is not None and not agent_token_is_live(token_id):
        raise RegistrationRefused("the host token was revoked", CLOSE_TOKEN_REFUSED)
    _refuse_foreign_devices(host, frame)
    Host.objects.filter(pk=host.pk).update(
        address=frame.address, simulated=frame.simulated, heartbeat_interval_s=frame.heartbeat_interval_s
    )
    reported = {d.index for d in frame.devices}
    gone = Device.objects.filter(host=host, deployments__isnull=True).exclude(index__in=reported)
    _delete_devices(list(gone.values_list("pk", flat=True)))
    _free_moved_uuids(host, frame)
    for info in frame.devices:
        Device.objects.update_or_create(
            host=host,
            index=info.index,
            defaults={
                "uuid": info.uuid,
                "name": info.name,
                "kind": DeviceKind.GPU if info.kind == "gpu" else DeviceKind.CPU,
                "memory_total_bytes": info.memory_total_bytes,
                "nvlink_peers": sorted(info.nvlink_peers),
            },
        )
    link, _ = AgentLink.objects.update_or_create(
        host=host,
        defaults={"connected": True, "agent_version": frame.agent_version, "connected_at": now},
    )
    AgentLink.objects.filter(pk=link.pk).update(run=F("run") + 1)  # row-locked until commit
    run = AgentLink.objects.filter(pk=link.pk).values_list("run", flat=True).get()
    mark_seen(host, now)
    reconcile.registered(host.pk)
    devices = dict(Device.objects.filter(host=host).values_list("index", "pk"))
    return LinkedHost(
        host_id=host.pk,
        name=host.name,
        address=frame.address,
        simulated=frame.simulated,
        device_ids=devices,
        deployment_ids=set(Deployment.objects.filter(host=host).values_list("pk", flat=True)),
        connected_at=now,
        run=run,
    )


def _delete_devices(pks: list[int]) -> None:
    """Delete these devices, their rows locked first (``lock_devices_for_delete``: telemetry
    retention holds the devices it folds while it deletes their samples)."""
    if pks:
        lock_devices_for_delete(pks)
        Device.objects.filter(pk__in=pks).delete()


def _refuse_foreign_devices(host: Host, frame: Register) -> None:
    """Refuse a `register` reporting a device (by uuid) that another host registered: two agents
    report the same physical device (a GPU two agents on one machine both see), and device uuids
    are unique. The message names both sides, for the agent's log and the operator."""
    uuids = {d.uuid: d.index for d in frame.devices}
    taken = (
        Device.objects.filter(uuid__in=uuids)
        .exclude(host=host)
        .select_related("host")
        .order_by("host__name", "index")
        .first()
    )
    if taken is None:
        return
    raise RegistrationRefused(
        f"device {uuids[taken.uuid]} (uuid {taken.uuid!r}) is already registered by host"
        f" {taken.host.name!r} as its device {taken.index}: two agents report the same device."
        f" Run one agent per device, or, if host {taken.host.name!r} no longer has it, delete"
        " that host's device record",
        CLOSE_REGISTER_REFUSED,
        code="register_refused",
        field="devices",
    )


def _free_moved_uuids(host: Host, frame: Register) -> None:
    """Give a placeholder uuid to the host's devices whose uuid the frame reports at another index
    (a GPU left and the driver renumbered the rest, or two swapped places): uuids are unique, and
    the upsert by index that follows must not collide with them. A device reported at its index
    gets its uuid back there; one kept only for its deployments keeps the placeholder."""
    index_of = {d.uuid: d.index for d in frame.devices}
    moved = Device.objects.filter(host=host, uuid__in=index_of).values_list("pk", "index", "uuid")
    for pk, index, uuid in moved:
        if index_of[uuid] != index:
            Device.objects.filter(pk=pk).update(uuid=f"gone:{pk}:{uuid}"[:64])


def heartbeat(host_id: int, now: datetime | None = None) -> None:
    """A heartbeat: the host is online as of now."""
    mark_seen(Host(pk=host_id), now)


def disconnected(linked: LinkedHost, now: datetime | None = None) -> bool:
    """The agent's connection closed: mark the link disconnected, unless a newer connection of the
    host registered since (its link is live; the older one's end changes nothing). Returns whether
    the link was marked. The host's status is left to the liveness sweep, which marks it stale
    after missed heartbeats (a reconnect within that time goes unnoticed)."""
    return bool(
        AgentLink.objects.filter(host_id=linked.host_id, connected_at=linked.connected_at).update(
            connected=False, disconnected_at=now or timezone.now()
        )
    )


def session_end(token_id: int, linked: LinkedHost | None) -> int | None:
    """The close code that ends a connection authenticated by ``token_id``, or None to keep it.

    `CLOSE_TOKEN_REFUSED` once the token is revoked; `CLOSE_SUPERSEDED` once a newer connection of
    the host registered (only for a registered connection: ``linked`` is its `register` result).
    """
    if not agent_token_is_live(token_id):
        return CLOSE_TOKEN_REFUSED
    if linked is not None:
        current = AgentLink.objects.filter(host_id=linked.host_id).values_list("connected_at", flat=True)
        if current.first() != linked.connected_at:
            return CLOSE_SUPERSEDED
    return None


def count_rejected(host_id: int) -> None:
    """One more malformed frame from the host's agent."""
    AgentLink.objects.filter(host_id=host_id).update(frames_rejected=F("frames_rejected") + 1)


def replica_url(address: str, port: int | None) -> str:
    """``http://<address>:<port>`` (IPv6 literals bracketed); "" without a port or address."""
    if port is None or not address:
        return ""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{port}"


@transaction.atomic
def report_status(linked: LinkedHost, frame: DeploymentStatus) -> Replica | None:
    """Record a `deployment_status`: the deployment's observed state and its replica. Returns the
    replica as stored, or None when the status was ignored.

    Within one agent run (one registration) the newest status (by its ``ts``, the agent's clock)
    stands: one older than the stored one (sent before it, delivered after it) changes nothing. A
    run's first status stands whatever its ``ts``: a restarted agent's clock may be behind the one
    that sent the stored status. A status of an older run (a connection superseded by a newer
    registration, still delivering) changes nothing. The same status again (the agent re-sends
    every status after `register`) is recorded again.

    Raises:
        UnknownDeployment: the id is not a deployment of this host (or no longer exists).
    """
    deployment = _host_deployment(linked, frame.deployment_id)
    reported_at = datetime.fromtimestamp(frame.ts, UTC)
    replica = Replica.objects.filter(deployment=deployment).first()
    stale = _stale_because(linked, replica, reported_at)
    if stale:
        log.info(
            "Ignored a %s status of deployment %s from %s (agent run %s): %s.",
            frame.state,
            deployment.pk,
            reported_at.isoformat(),
            linked.run,
            stale,
        )
        return None
    report_observed_state(deployment, ObservedState(frame.state), frame.error or "")
    running = frame.state == "running"
    replica, _ = Replica.objects.update_or_create(
        deployment=deployment,
        defaults={
            "state": frame.state,
            "error": frame.error or "",
            "restarts": frame.restarts,
            "port": frame.port,
            "base_url": replica_url(linked.address, frame.port) if running else "",
            "simulated": frame.simulated,
            "reported_at": reported_at,
            "run": linked.run,
        },
    )
    return replica


def _stale_because(linked: LinkedHost, replica: Replica | None, reported_at: datetime) -> str:
    """Why a status of ``linked``'s run, sent at ``reported_at``, must not replace ``replica`` (the
    stored one); "" when it stands."""
    current = AgentLink.objects.filter(host_id=linked.host_id).values_list("run", flat=True).first()
    newest = max(current or 0, replica.run if replica is not None else 0)
    if linked.run < newest:
        return f"agent run {newest} of the host has registered since"
    if replica is not None and replica.run == linked.run and reported_at < replica.reported_at:
        return f"the {replica.state} status stored is newer ({replica.reported_at.isoformat()})"
    return ""


def is_host_deployment(linked: LinkedHost, wire_id: str) -> bool:
    """Whether the wire id names a deployment of the linked host (``linked.deployment_ids``, and
    the database on a miss: a deployment made in another process since the last refresh)."""
    pk = wire_pk(wire_id)
    if pk is None:
        return False
    if pk in linked.deployment_ids:
        return True
    if Deployment.objects.filter(pk=pk, host_id=linked.host_id).exists():
        linked.deployment_ids.add(pk)
        return True
    return False


def _host_deployment(linked: LinkedHost, wire_id: str) -> Deployment:
    pk = wire_pk(wire_id)
    if pk is None:
        raise UnknownDeployment(f"deployment id {wire_id[:40]!r} is not one this control plane issued")
    # Locked until the status is stored: a deletion or an edit of the deployment waits for it (or
    # it for them), so a status never writes a replica of a deleted deployment or over an edit.
    deployment = Deployment.objects.select_for_update().filter(pk=pk, host_id=linked.host_id).first()
    if deployment is None:
        raise UnknownDeployment(f"deployment {wire_id} is not on host {linked.name}")
    return deployment


def desired_deployments(linked: LinkedHost) -> DesiredDeployments:
    """The full list of deployments the host must run (desired state running), ordered by id.

    Also refreshes ``linked.deployment_ids`` (every deployment of the host, whatever its state),
    which telemetry ingestion uses to accept engine samples.
    """
    deployments = list(
        Deployment.objects.filter(host_id=linked.host_id)
        .select_related("model")
        .prefetch_related("devices")
        .order_by("pk")
    )
    linked.deployment_ids = {d.pk for d in deployments}
    specs = []
    for deployment in deployments:
        if deployment.desired_state != DesiredState.RUNNING:
            continue
        model = deployment.model
        specs.append(
            DeploymentSpec(
                id=str(deployment.pk),
                model=ModelSpec(
                    name=model.name,
                    source=model.source,
                    dtype=model.dtype,
                    tensor_parallel_size=model.tensor_parallel_size,
                    max_context_len=model.max_context_length,
                    engine_options=dict(model.engine_options),
                ),
                devices=sorted(d.index for d in deployment.devices.all()),
                api_key=engine_api_key(deployment.pk),
            )
        )
    return DesiredDeployments(deployments=specs)


def notify_desired_changed(host_id: int) -> None:
    """Tell the host's connected agent (in this process's channel layer) to re-read its desired list.

    With the in-memory layer this reaches only consumers of the calling process; connections also
    poll the list every ``AGENTS_DESIRED_POLL_S``, so changes made by a Celery worker arrive too.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(agent_group(host_id), {"type": "desired.changed"})


def notify_tokens_revoked(host_id: int, token_ids: list[int]) -> None:
    """Tell the host's connections (in this process's channel layer) that these tokens are revoked;
    those that authenticated with one close. Others find out by polling (`session_end`)."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "agent.revoked", "token_ids": list(token_ids)}
    async_to_sync(layer.group_send)(agent_group(host_id), message)


def send_command(host_id: int, frame_dict: dict[str, object]) -> None:
    """Relay a `command` frame (``Command(...).to_dict()``) to the host's connected agent."""
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(agent_group(host_id), {"type": "agent.command", "frame": frame_dict})
