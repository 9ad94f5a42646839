"""Logging filters named in settings.LOGGING.

``QuietHousekeeping``: Celery logs three INFO lines for every run of a periodic task (beat's
"Sending due task", the worker's "received" and "succeeded"). The beat schedule's housekeeping
tasks run every few seconds (the liveness sweep every 5 s), so under ``make run`` those lines were
most of the terminal and buried the agent's and the engines' lines. The filter drops them for the
tasks it is given; a task's failure (Celery logs it at ERROR) and what a task did (each logs its own
changes: hosts that changed status, jobs failed as lost, rows pruned) still show.
``LOG_HOUSEKEEPING=1`` keeps every line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

# Where Celery logs a periodic task's routine runs, all at INFO.
CELERY_ROUTINE_LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})


class QuietHousekeeping(logging.Filter):
    """Drop Celery's routine INFO lines (sent, received, succeeded) about ``tasks``."""

    def __init__(self, tasks: Iterable[str] = ()) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or record.name not in CELERY_ROUTINE_LOGGERS:
            return True
        return not (_task_names(record.args) & self.tasks)


def _task_names(args: object) -> set[object]:
    """The task names a Celery log call passed: the worker and the tracer pass one mapping with
    ``name``; beat passes ``(entry name, task name)``."""
    if isinstance(args, Mapping):
        return {args.get("name")}
    if isinstance(args, tuple):
        return {a for a in args if isinstance(a, str)}
    return set()
