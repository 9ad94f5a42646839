"""The periodic sweep of the ASGI process: host liveness (and the observed state of offline and returning
hosts' deployments, agents/reconcile.py) every second, telemetry retention every minute.

Why here: `make run` starts no Celery beat, and liveness must advance (online -> stale -> offline)
even when nothing else happens. The first request or connection an ASGI process serves
(config/asgi.py: an agent's, a browser's, a health check) starts one sweeper task on that process's
event loop; it runs until the loop ends. Not only an agent's: a web process that no agent reaches
(restarted while the agents were down, a second one) would otherwise leave dead hosts online for
good without beat. Several ASGI processes each run one: the liveness sweep is idempotent, and
retention runs in a transaction. Where Celery beat runs (production), the same work is scheduled as
the tasks in agents/tasks.py; set ``AGENTS_SWEEP_IN_ASGI=false`` to leave it to beat alone.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from agents import reconcile
from agents.retention import downsample_and_prune

log = logging.getLogger(__name__)

_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}


def ensure_started() -> asyncio.Task[None] | None:
    """Start this event loop's sweeper unless it runs already (or is disabled by settings)."""
    if not settings.AGENTS_SWEEP_IN_ASGI:
        return None
    loop = asyncio.get_running_loop()
    task = _tasks.get(loop)
    if task is None or task.done():
        for stale_loop in [lp for lp in _tasks if lp.is_closed()]:
            del _tasks[stale_loop]
        task = _tasks[loop] = loop.create_task(run_sweeper(), name="agents-sweeper")
        log.info("Agents sweeper started (liveness every %.1f s).", settings.AGENTS_SWEEP_INTERVAL_S)
    return task


async def stop() -> None:
    """Cancel this loop's sweeper (tests; process shutdown cancels it anyway)."""
    task = _tasks.pop(asyncio.get_running_loop(), None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def run_sweeper() -> None:
    """Sweep until cancelled; a failing sweep is logged and retried on the next tick."""
    next_retention = time.monotonic() + settings.TELEMETRY_DOWNSAMPLE_INTERVAL_S
    while True:
        try:
            await database_sync_to_async(reconcile.sweep)()  # logs hosts that changed status
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + settings.TELEMETRY_DOWNSAMPLE_INTERVAL_S
                await database_sync_to_async(downsample_and_prune)()
        except Exception:
            log.exception("Agents sweep failed")
        await asyncio.sleep(settings.AGENTS_SWEEP_INTERVAL_S)
