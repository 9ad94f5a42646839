"""Celery tasks of the agents app (scheduled by Celery beat in production; see settings)."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from agents import reconcile
from agents.retention import downsample_and_prune


@shared_task(
    name="agents.sweep_liveness",
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
    ignore_result=True,
)
def sweep_liveness() -> int:
    """Recompute every host's online/stale/offline status, and the observed state of offline and
    returning hosts' deployments; returns how many hosts changed status."""
    return reconcile.sweep()


@shared_task(
    name="agents.downsample_telemetry",
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
    ignore_result=True,
)
def downsample_telemetry() -> int:
    """Fold old raw telemetry into per-minute rows and prune; returns raw rows folded."""
    return downsample_and_prune().raw_deleted
