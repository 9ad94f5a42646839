"""The job-kind registry: what a job of each kind accepts and runs.

A kind pairs a DRF serializer that validates (and fills defaults into) the job's parameters with
a runner ``run(params, ctx) -> result``. Runners report progress and hit cancellation points
through ``ctx`` (see ``JobContext``). Kinds register at import time from ``jobs/kinds/`` (or from
another app's ``ready()``); a duplicate name raises ``ValueError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers


class JobCancelled(Exception):
    """Raised at a cancellation point when the job's row says it was cancelled."""


class JobRefused(serializers.ValidationError):
    """A kind's ``admit`` refuses the job: ``errors`` maps parameter names to messages.

    A ValidationError of the ``params`` field, so that the API answers it as a 400 like the
    params serializer's own errors."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__({"params": errors})
        self.errors = errors


class JobContext(ABC):
    """What a runner may do besides computing: report progress, check for cancellation."""

    @abstractmethod
    def progress(self, fraction: float) -> None:
        """Record progress in [0, 1] and check for cancellation.

        Called by runners between steps. Raises ``JobCancelled`` if the job was cancelled.
        """

    @abstractmethod
    def check_cancelled(self) -> None:
        """Raise ``JobCancelled`` if the job was cancelled (a cancellation point without progress)."""

    @abstractmethod
    def on_success(self, write: Callable[[], object]) -> None:
        """Register ``write``, the runner's outcome (a model's profile, a plan), to be applied as
        the job finishes.

        Called by a runner that has its outcome, instead of writing it itself: ``write`` runs in the
        transaction that marks the job succeeded, once the job's row is locked and found still
        running, so a job cancelled before its outcome is written leaves nothing, and a cancel
        after it finds the job succeeded. An exception from ``write`` fails the job as the
        runner's own would, and nothing it wrote is kept.
        """


Runner = Callable[[dict[str, Any], JobContext], dict[str, Any]]


@dataclass(frozen=True)
class JobKind:
    """One kind of job.

    Attributes:
        name: the ``kind`` value clients send, e.g. ``"noop"``.
        params_serializer: validates the ``params`` object; unknown keys must be rejected.
        run: the work; returns a JSON-serialisable result stored on the job.
        description: one line for the API schema and the dashboard.
        admit: called with the validated params inside the transaction that stores the job, just
            before the row is written; raises ``JobRefused`` to refuse it. What the params
            serializer checks against other rows (another active job, say) can change before
            the row is written, so a kind that must not run twice at once locks a row here and
            checks again: concurrent posts then wait for each other's commit.
        expected_errors: exceptions that say why the job cannot be done (a model that cannot be
            placed, a profile that cannot be measured): the job's ``error`` is their message
            alone. Any other exception is a bug, stored with its traceback.
    """

    name: str
    params_serializer: type[serializers.Serializer]
    run: Runner
    description: str = ""
    admit: Callable[[dict[str, Any]], None] | None = None
    expected_errors: tuple[type[Exception], ...] = ()


_KINDS: dict[str, JobKind] = {}


def register(kind: JobKind) -> JobKind:
    """Add a kind; a second kind with the same name is a programming error."""
    if kind.name in _KINDS:
        raise ValueError(f"job kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> JobKind:
    """The kind called ``name``; ``KeyError`` if none."""
    return _KINDS[name]


def kind_names() -> list[str]:
    """Registered kind names, sorted."""
    return sorted(_KINDS)
