"""Deployment changes -> the host's agent connection re-sends its desired list; a revoked agent
token -> the connections it authenticated are closed.

Hooks, not edits: neither the deployments app nor inventory knows about agents. After the
transaction commits, the host's group in this process's channel layer is told; connections
elsewhere pick the change up by polling (see agents/consumers.py).
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.models import Deployment
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver
from inventory.models import AgentToken
from inventory.services import agent_tokens_revoked
from registry.models import ServedModel

from agents.services import notify_desired_changed, notify_tokens_revoked

log = logging.getLogger(__name__)


def _notify_after_commit(host_ids: set[int]) -> None:
    def notify() -> None:
        for host_id in sorted(host_ids):
            try:
                notify_desired_changed(host_id)
            except Exception:
                # The change is stored; connections poll for it. Never fail the write over this.
                log.exception("Notifying the agent of host %s failed", host_id)

    transaction.on_commit(notify)


@receiver(post_save, sender=Deployment, dispatch_uid="agents.deployment_saved")
@receiver(post_delete, sender=Deployment, dispatch_uid="agents.deployment_deleted")
def deployment_changed(sender: Any, instance: Deployment, **kwargs: Any) -> None:
    _notify_after_commit({instance.host_id})


@receiver(m2m_changed, sender=Deployment.devices.through, dispatch_uid="agents.deployment_devices")
def deployment_devices_changed(sender: Any, instance: Any, action: str, **kwargs: Any) -> None:
    if action in ("post_add", "post_remove", "post_clear") and isinstance(instance, Deployment):
        _notify_after_commit({instance.host_id})


@receiver(post_save, sender=ServedModel, dispatch_uid="agents.model_saved")
def model_changed(sender: Any, instance: ServedModel, created: bool, **kwargs: Any) -> None:
    if not created:
        _notify_after_commit(set(Deployment.objects.filter(model=instance).values_list("host_id", flat=True)))


@receiver(agent_tokens_revoked, sender=AgentToken, dispatch_uid="agents.tokens_revoked")
def tokens_revoked(sender: Any, host_id: int, token_ids: list[int], **kwargs: Any) -> None:
    def notify() -> None:
        try:
            notify_tokens_revoked(host_id, token_ids)
        except Exception:
            # The revocation is stored; connections re-check their token when they poll.
            log.exception("Telling the agent connections of host %s about revoked tokens failed", host_id)

    transaction.on_commit(notify)
