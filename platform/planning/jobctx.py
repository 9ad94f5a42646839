"""Adapters from the jobs app's `JobContext` to serving's (progress, should_cancel) callbacks."""

from __future__ import annotations

from collections.abc import Callable

from jobs.registry import JobCancelled, JobContext


def progress_fn(ctx: JobContext, start: float = 0.0, end: float = 1.0) -> Callable[[float, str], None]:
    """serving's progress(fraction, message) -> ``ctx.progress`` scaled into [start, end]."""

    def progress(fraction: float, message: str) -> None:
        ctx.progress(start + (end - start) * fraction)

    return progress


def cancel_fn(ctx: JobContext) -> Callable[[], bool]:
    """serving's should_cancel() -> True once the job's row says cancelled."""

    def should_cancel() -> bool:
        try:
            ctx.check_cancelled()
        except JobCancelled:
            return True
        return False

    return should_cancel


def job_id_of(ctx: JobContext) -> int | None:
    """The job's primary key when the context is the jobs app's row context (None otherwise)."""
    value = getattr(ctx, "job_id", None)
    return value if isinstance(value, int) else None
