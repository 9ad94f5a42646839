from __future__ import annotations

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        # Built-in job kinds register themselves on import.
        from jobs.kinds import noop  # noqa: F401
