"""The console log of a running platform: Celery's routine lines about the beat schedule's
housekeeping tasks are dropped (three every 5 s buried everything else under `make run`), while
other tasks' lines, any failure and what a housekeeping task changed still show."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from agents.tasks import sweep_liveness
from celery.app import trace
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from inventory.models import Host, HostStatus

from config.log_filters import QuietHousekeeping


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def console() -> Iterator[Collect]:
    """A handler with the filters settings.LOGGING gives the console, on the root logger."""
    configured = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
    assert configured, "settings.LOGGING's console handler is not installed"
    assert any(isinstance(f, QuietHousekeeping) for f in configured[0].filters)
    handler = Collect()
    handler.filters = list(configured[0].filters)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def succeeded(task: str) -> None:
    """What Celery's tracer logs after a task ran (its own call and format)."""
    trace.info(trace.LOG_SUCCESS, {"id": "1", "name": task, "return_value": "0", "runtime": 0.01})


def test_every_beat_task_is_housekeeping() -> None:
    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert set(settings.HOUSEKEEPING_TASKS) == tasks


def test_routine_lines_of_housekeeping_tasks_are_dropped(console: Collect) -> None:
    logging.getLogger("celery.beat").info(
        "Scheduler: Sending due task %s (%s)", "agents-liveness", "agents.sweep_liveness"
    )
    trace.info(trace.LOG_RECEIVED, {"id": "1", "name": "agents.sweep_liveness", "args": "()"})
    succeeded("agents.sweep_liveness")
    succeeded("jobs.fail_lost_jobs")
    assert console.lines == []


def test_other_tasks_and_failures_still_show(console: Collect) -> None:
    succeeded("jobs.run_job")
    logging.getLogger("celery.app.trace").error(
        trace.LOG_FAILURE,
        {"id": "2", "name": "agents.sweep_liveness", "description": "raised unexpected", "exc": "boom"},
    )
    assert console.lines == [
        "Task jobs.run_job[1] succeeded in 0.01s: 0",
        "Task agents.sweep_liveness[2] raised unexpected: boom",
    ]


def test_without_tasks_the_filter_keeps_every_line() -> None:
    record = logging.LogRecord("celery.app.trace", logging.INFO, __file__, 1, trace.LOG_SUCCESS, None, None)
    record.args = {"id": "1", "name": "agents.sweep_liveness", "return_value": "0", "runtime": 0.0}
    assert QuietHousekeeping().filter(record)
    assert not QuietHousekeeping(["agents.sweep_liveness"]).filter(record)


@pytest.mark.django_db
@override_settings(HOST_STALE_AFTER_S=2.5, HOST_OFFLINE_AFTER_S=6.0)
def test_a_sweep_that_changes_a_host_says_so(console: Collect) -> None:
    Host.objects.create(
        name="quiet", status=HostStatus.ONLINE, last_seen_at=timezone.now() - timedelta(seconds=3)
    )
    assert sweep_liveness() == 1
    assert console.lines == ["Liveness sweep: 1 host(s) changed status."]
    sweep_liveness()  # nothing changed: nothing to say
    assert len(console.lines) == 1
