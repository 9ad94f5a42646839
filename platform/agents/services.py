"""Agent link operations: authenticate, register, liveness, deployment reports, desired state.

The consumer (agents/consumers.py) parses frames with ``gpu_agent.protocol`` and calls these; every
function here is synchronous ORM code (the consumer wraps it in ``database_sync_to_async``).

Wire identifiers: a deployment's id on the wire is ``str(Deployment.pk)``; devices are named by
their host-local ``index``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from deployments.models import Deployment, DesiredState, ObservedState
from deployments.services import report_observed_state
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from inventory.models import Device, DeviceKind, Host
from inventory.services import authenticate_agent, mark_seen

from agents.models import AgentLink, Replica
from gpu_agent.protocol import (
    DeploymentSpec,
    DeploymentStatus,
    DesiredDeployments,
    ModelSpec,
    Register,
)

log = logging.getLogger(__name__)


class RegistrationRefused(Exception):
    """The agent's `register` frame does not match the host its token belongs to."""


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


def agent_group(host_id: int) -> str:
    """The channel-layer group of a host's agent connection(s)."""
    return f"agent.{host_id}"


def authenticate(token: str) -> Host | None:
    """The host whose live agent token this is (inventory's digests), else None."""
    return authenticate_agent(token) if token else None


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str:
    """The token of an ``Authorization: Bearer <token>`` header in an ASGI scope, or ""."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


@transaction.atomic
def register(host: Host, frame: Register, now: datetime | None = None) -> LinkedHost:
    """Record the agent's host and devices (upsert by device index) and mark the host online.

    Devices the agent no longer reports are deleted unless a deployment still uses them (then they
    are kept, so the operator sees the deployment fail instead of silently losing its devices).

    Raises:
        RegistrationRefused: the frame names another host than the token's.
    """
    now = now or timezone.now()
    if frame.host != host.name:
        raise RegistrationRefused(
            f"this token belongs to host {host.name!r}, but the agent registered as {frame.host!r}"
        )
    Host.objects.filter(pk=host.pk).update(address=frame.address, simulated=frame.simulated)
    reported = {d.index for d in frame.devices}
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
    Device.objects.filter(host=host, deployments__isnull=True).exclude(index__in=reported).delete()
    AgentLink.objects.update_or_create(
        host=host,
        defaults={"connected": True, "agent_version": frame.agent_version, "connected_at": now},
    )
    mark_seen(host, now)
    devices = dict(Device.objects.filter(host=host).values_list("index", "pk"))
    return LinkedHost(
        host_id=host.pk,
        name=host.name,
        address=frame.address,
        simulated=frame.simulated,
        device_ids=devices,
        deployment_ids=set(Deployment.objects.filter(host=host).values_list("pk", flat=True)),
    )


def heartbeat(host_id: int, now: datetime | None = None) -> None:
    """A heartbeat: the host is online as of now."""
    mark_seen(Host(pk=host_id), now)


def disconnected(host_id: int, now: datetime | None = None) -> None:
    """The agent's connection closed. The host's status is left to the liveness sweep, which marks
    it stale after missed heartbeats (a reconnect within that time goes unnoticed)."""
    AgentLink.objects.filter(host_id=host_id).update(connected=False, disconnected_at=now or timezone.now())


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
def report_status(linked: LinkedHost, frame: DeploymentStatus) -> Replica:
    """Record a `deployment_status`: the deployment's observed state and its replica.

    Raises:
        UnknownDeployment: the id is not a deployment of this host.
    """
    deployment = _host_deployment(linked, frame.deployment_id)
    state = ObservedState(frame.state)
    report_observed_state(deployment, state, frame.error or "")
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
            "reported_at": datetime.fromtimestamp(frame.ts, UTC),
        },
    )
    return replica


def _host_deployment(linked: LinkedHost, wire_id: str) -> Deployment:
    try:
        pk = int(wire_id)
    except ValueError:
        raise UnknownDeployment(f"deployment id {wire_id!r} is not one this control plane issued") from None
    deployment = Deployment.objects.filter(pk=pk, host_id=linked.host_id).first()
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


def send_command(host_id: int, frame_dict: dict[str, object]) -> None:
    """Relay a `command` frame (``Command(...).to_dict()``) to the host's connected agent."""
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(agent_group(host_id), {"type": "agent.command", "frame": frame_dict})
