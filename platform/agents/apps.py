from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The control plane's side of the GPU agents: their websocket link, liveness, telemetry with
    bounded retention, and the replicas (engine URLs) they report."""

    name = "agents"
    verbose_name = "Agents (link, liveness, telemetry)"

    def ready(self) -> None:
        from agents import signals  # noqa: F401  (connects the deployment-change hooks)
