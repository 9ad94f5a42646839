from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Operator dashboard: server-rendered pages, live updates over websockets (dashboard/consumers)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "dashboard"
