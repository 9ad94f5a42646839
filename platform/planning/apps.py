from __future__ import annotations

from django.apps import AppConfig


class PlanningConfig(AppConfig):
    """Profiling and placement: the `profile` and `place` job kinds, model profiles, stored plans
    and their application to deployments, and probes relayed to agents (real-engine profiling)."""

    name = "planning"
    verbose_name = "Planning (profiles, placement)"

    def ready(self) -> None:
        # The job kinds register themselves with the jobs registry on import.
        from jobs.kinds import place, profile  # noqa: F401
