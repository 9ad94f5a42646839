"""Observed state that no `deployment_status` will report, set by the control plane.

- ``hosts_offline``: a host's agent fell silent (the host is offline): its engines' states are
  unknown, so its deployments that were starting or running are ``unknown`` (neither routed to nor
  profiled, not shown converged) until the host is back.
- ``hosts_back``: the host is online again: ``unknown`` deployments take the state the agent last
  reported (their replica), for an agent whose heartbeats resumed on the same connection re-sends
  nothing. An agent that reconnects re-sends every status after `register`, which then stands.
- ``registered``: also on `register`, a deployment meant to be stopped is observed stopped: a
  restarted agent has no engine of it and reports nothing about it; one that still runs it
  re-sends its status right after `register` and reports `stopped` once it stopped it.

The liveness sweep (agents/sweeper.py in the ASGI process, agents/tasks.py under Celery beat)
runs ``sweep`` every second; every step is an idempotent UPDATE.
"""

from __future__ import annotations

import logging
from datetime import datetime

from deployments.models import ENGINE_UP, Deployment, DesiredState, ObservedState
from django.db.models import CharField, F, OuterRef, Subquery, TextField, Value
from django.db.models.functions import Coalesce, Concat
from django.utils import timezone
from inventory.models import Host, HostStatus
from inventory.services import refresh_statuses

from agents.models import Replica

log = logging.getLogger(__name__)


def sweep(now: datetime | None = None) -> int:
    """Recompute host liveness, then the observed state of offline and returning hosts'
    deployments; returns how many hosts changed status."""
    now = now or timezone.now()
    changed = refresh_statuses(now)
    hosts_offline(now)
    hosts_back(now=now)
    if changed:  # the one line a sweep logs (its Celery task's routine lines are filtered out)
        log.info("Liveness sweep: %d host(s) changed status.", changed)
    return changed


def hosts_offline(now: datetime | None = None) -> int:
    """Starting or running deployments of offline hosts become unknown; returns how many."""
    offline = Host.objects.filter(status=HostStatus.OFFLINE).values("pk")
    return Deployment.objects.filter(host_id__in=offline, observed_state__in=ENGINE_UP).update(
        observed_state=ObservedState.UNKNOWN,
        observed_message=Concat(
            Value("the host is offline; its agent last reported "),
            F("observed_state"),
            output_field=TextField(),
        ),
        observed_at=now or timezone.now(),
    )


def hosts_back(host_id: int | None = None, now: datetime | None = None) -> int:
    """Unknown deployments of online hosts (or of ``host_id``) take their replica's state, or
    pending without one; returns how many."""
    online = Host.objects.filter(status=HostStatus.ONLINE).values("pk")
    unknown = Deployment.objects.filter(host_id__in=online, observed_state=ObservedState.UNKNOWN)
    if host_id is not None:
        unknown = unknown.filter(host_id=host_id)
    replica = Replica.objects.filter(deployment=OuterRef("pk"))
    return unknown.update(
        observed_state=Coalesce(
            Subquery(replica.values("state")[:1]),
            Value(ObservedState.PENDING.value),
            output_field=CharField(),
        ),
        observed_message=Coalesce(Subquery(replica.values("error")[:1]), Value(""), output_field=TextField()),
        observed_at=now or timezone.now(),
    )


def registered(host_id: int, now: datetime | None = None) -> None:
    """The host's agent registered (the host is online): settle what it will not report."""
    now = now or timezone.now()
    hosts_back(host_id, now)
    Deployment.objects.filter(host_id=host_id, desired_state=DesiredState.STOPPED).exclude(
        observed_state=ObservedState.STOPPED
    ).update(observed_state=ObservedState.STOPPED, observed_message="", observed_at=now, restart_from=None)
