"""Inventory operations: registering hosts, agent credentials, liveness."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from core.secrets import Issued, digest_secret, issue_secret
from inventory.models import AgentToken, Host, HostStatus

# Sent (inside the revoking transaction) with ``host_id`` and ``token_ids`` when agent tokens are
# revoked. The agents app listens and closes live connections that authenticated with them: a
# websocket checks its token only at the handshake, so without this a rotated-out token would keep
# its open session. Inventory does not know about agent connections; hence a signal, not a call.
agent_tokens_revoked = Signal()


def register_host(name: str, address: str | None = None, *, simulated: bool | None = None) -> Host:
    """Create the host ``name`` or update it; returns the row. What is not given (None) is kept,
    and a new host has no address and is not simulated: `register_host NAME` run again for a fresh
    token wiped the address its replicas are reached at and made a simulated host a real one, whose
    models /v1 then listed (and answered 503 for) until its agent registered again."""
    given = {k: v for k, v in (("address", address), ("simulated", simulated)) if v is not None}
    host, created = Host.objects.get_or_create(
        name=name, defaults={"address": "", "simulated": False, **given}
    )
    if not created and given:
        for key, value in given.items():
            setattr(host, key, value)
        host.save(update_fields=list(given))
    return host


@transaction.atomic
def issue_agent_token(host: Host) -> Issued:
    """A new token for the host's agent. Earlier tokens of the host are revoked (and their open
    agent connections closed, see ``agent_tokens_revoked``)."""
    live = AgentToken.objects.filter(host=host, revoked=False)
    revoked = sorted(live.values_list("pk", flat=True))
    if revoked:
        AgentToken.objects.filter(pk__in=revoked).update(revoked=True)
        agent_tokens_revoked.send(sender=AgentToken, host_id=host.pk, token_ids=revoked)
    secret = issue_secret("agt")
    token = AgentToken.objects.create(host=host, prefix=secret.prefix, digest=secret.digest)
    return Issued(record=token, plaintext=secret.plaintext)


def live_agent_token(plaintext: str) -> AgentToken | None:
    """The live (not revoked) agent token with this plaintext, with its host, else ``None``."""
    return (
        AgentToken.objects.select_related("host")
        .filter(digest=digest_secret(plaintext), revoked=False)
        .first()
    )


def authenticate_agent(plaintext: str) -> Host | None:
    """The host whose live agent token this is, else ``None``."""
    token = live_agent_token(plaintext)
    return None if token is None else token.host


def agent_token_is_live(token_id: int) -> bool:
    """Whether the token still exists and is not revoked (an open connection re-checks its own)."""
    return AgentToken.objects.filter(pk=token_id, revoked=False).exists()


# A host is stale after this many of its heartbeat intervals without one: two missed beats and half
# a beat of jitter, as HOST_STALE_AFTER_S's default (2.5 s) is for the agents' default 1 s beat.
STALE_AFTER_BEATS = 2.5


def stale_after_s(heartbeat_interval_s: float | None) -> float:
    """How long a host whose agent beats every ``heartbeat_interval_s`` (None: it did not say, the
    default 1 s) may stay silent and still be online: ``HOST_STALE_AFTER_S``, or
    ``STALE_AFTER_BEATS`` beats of a slower agent. Without the latter an agent started with
    ``--telemetry-interval-s 5`` went stale between every two beats, and the gateway, which routes
    to online hosts only, dropped its replicas half the time."""
    beats = STALE_AFTER_BEATS * heartbeat_interval_s if heartbeat_interval_s else 0.0
    return max(float(settings.HOST_STALE_AFTER_S), beats)


def status_at(
    last_seen_at: datetime | None, now: datetime, heartbeat_interval_s: float | None = None
) -> HostStatus:
    """Liveness from the last heartbeat: online, then stale, then offline as silence grows.

    Stale after `stale_after_s` (the agent's registered beat counts), offline after
    ``HOST_OFFLINE_AFTER_S``, or at once when a slow agent's stale time is beyond it.
    """
    if last_seen_at is None:
        return HostStatus.OFFLINE
    silent_s = (now - last_seen_at).total_seconds()
    stale_s = stale_after_s(heartbeat_interval_s)
    if silent_s <= stale_s:
        return HostStatus.ONLINE
    if silent_s <= max(float(settings.HOST_OFFLINE_AFTER_S), stale_s):
        return HostStatus.STALE
    return HostStatus.OFFLINE


def mark_seen(host: Host, now: datetime | None = None) -> Host:
    """Record a heartbeat from the host's agent (nothing when the host was deleted meanwhile)."""
    now = now or timezone.now()
    Host.objects.filter(pk=host.pk).update(last_seen_at=now, status=HostStatus.ONLINE)
    host.last_seen_at, host.status = now, HostStatus.ONLINE  # no re-read: the row may be gone
    return host


def refresh_statuses(now: datetime | None = None) -> int:
    """Recompute every host's status from its last heartbeat; returns how many changed."""
    now = now or timezone.now()
    changed = 0
    for host in Host.objects.order_by("id"):
        status = status_at(host.last_seen_at, now, host.heartbeat_interval_s)
        if status != host.status:
            changed += Host.objects.filter(pk=host.pk).update(status=status)
    return changed
