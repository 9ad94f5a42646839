"""Inventory operations: registering hosts, agent credentials, liveness."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.secrets import Issued, digest_secret, issue_secret
from inventory.models import AgentToken, Host, HostStatus


def register_host(name: str, address: str = "", *, simulated: bool = False) -> Host:
    """Create the host ``name`` or update its address; returns the row."""
    host, _ = Host.objects.update_or_create(name=name, defaults={"address": address, "simulated": simulated})
    return host


@transaction.atomic
def issue_agent_token(host: Host) -> Issued:
    """A new token for the host's agent. Earlier tokens of the host are revoked."""
    AgentToken.objects.filter(host=host, revoked=False).update(revoked=True)
    secret = issue_secret("agt")
    token = AgentToken.objects.create(host=host, prefix=secret.prefix, digest=secret.digest)
    return Issued(record=token, plaintext=secret.plaintext)


def authenticate_agent(plaintext: str) -> Host | None:
    """The host whose live agent token this is, else ``None``."""
    token = (
        AgentToken.objects.select_related("host")
        .filter(digest=digest_secret(plaintext), revoked=False)
        .first()
    )
    return None if token is None else token.host


def status_at(last_seen_at: datetime | None, now: datetime) -> HostStatus:
    """Liveness from the last heartbeat: online, then stale, then offline as silence grows."""
    if last_seen_at is None:
        return HostStatus.OFFLINE
    silent_s = (now - last_seen_at).total_seconds()
    if silent_s <= settings.HOST_STALE_AFTER_S:
        return HostStatus.ONLINE
    if silent_s <= settings.HOST_OFFLINE_AFTER_S:
        return HostStatus.STALE
    return HostStatus.OFFLINE


def mark_seen(host: Host, now: datetime | None = None) -> Host:
    """Record a heartbeat from the host's agent."""
    now = now or timezone.now()
    Host.objects.filter(pk=host.pk).update(last_seen_at=now, status=HostStatus.ONLINE)
    host.refresh_from_db()
    return host


def refresh_statuses(now: datetime | None = None) -> int:
    """Recompute every host's status from its last heartbeat; returns how many changed."""
    now = now or timezone.now()
    changed = 0
    for host in Host.objects.order_by("id"):
        status = status_at(host.last_seen_at, now)
        if status != host.status:
            changed += Host.objects.filter(pk=host.pk).update(status=status)
    return changed
