"""Deployment changes -> the host's agent connection re-sends its desired list.

Hooks, not edits: the deployments app does not know about agents. After the transaction commits,
the host's group in this process's channel layer is told; connections elsewhere pick the change
up by polling (see agents/consumers.py).
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.models import Deployment
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver
from registry.models import ServedModel

from agents.services import notify_desired_changed

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
