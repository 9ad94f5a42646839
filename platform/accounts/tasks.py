"""Celery tasks of the accounts app: thin wrappers around accounts.services."""

from __future__ import annotations

from celery import shared_task

from accounts import services


@shared_task(name="accounts.prune_api_tokens", ignore_result=True)
def prune_api_tokens() -> int:
    """Delete expired operator API tokens (scheduled by Celery beat); returns how many."""
    return services.prune_expired_api_tokens()
