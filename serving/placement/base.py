"""The placer interface: profiles + servers -> Plan, with progress and cancellation hooks.

The control plane's job layer calls `Placer.place` with plain dataclasses and two callbacks and
stores `Plan.to_dict()`. Callbacks are invoked on the caller's thread only.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from serving.placement.inputs import ModelProfile, PlacementCancelled, PlacerConfig, ServerSpec
from serving.placement.instance import PlacementInstance
from serving.placement.plan import Plan

ProgressFn = Callable[[float, str], None]  # (fraction in [0, 1], message)
CancelFn = Callable[[], bool]  # True -> stop as soon as possible


def _no_progress(fraction: float, message: str) -> None:
    return None


def _never() -> bool:
    return False


class Placer(ABC):
    """Assigns every model to a server and GPUs, then pairs producers with consumers."""

    name: ClassVar[str] = "abstract"

    def __init__(self, config: PlacerConfig | None = None) -> None:
        self.config = config or PlacerConfig()

    def place(
        self,
        models: Sequence[ModelProfile],
        servers: Sequence[ServerSpec],
        *,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
    ) -> Plan:
        """Validate the instance and solve it.

        Args:
            models: Every model to place, each with its profile (see `require_profiles`).
            servers: The servers available.
            progress: Called with (fraction, message); reaches 1.0 on success.
            should_cancel: Polled while solving; when it returns True, PlacementCancelled is raised.

        Returns:
            A complete plan; nothing partial is ever returned.

        Raises:
            PlacementError: Invalid input or an infeasible instance (the message names the problem).
            PlacementCancelled: `should_cancel` returned True.
        """
        progress = progress or _no_progress
        should_cancel = should_cancel or _never
        started = time.perf_counter()
        instance = PlacementInstance.build(models, servers, self.config)
        progress(0.0, f"placing {instance.num_models} models on {instance.num_servers} servers")
        if should_cancel():
            raise PlacementCancelled("placement cancelled before solving")
        plan = self.solve(instance, progress, should_cancel, started)
        progress(1.0, f"{plan.status} plan, objective {plan.objective} (bound {plan.best_bound})")
        return plan

    @abstractmethod
    def solve(
        self, instance: PlacementInstance, progress: ProgressFn, should_cancel: CancelFn, started: float
    ) -> Plan:
        """Solve a validated instance; called by `place` after validation.

        Args:
            instance: The validated instance.
            progress: Progress callback (fractions strictly below 1.0; `place` sends 1.0).
            should_cancel: Cancellation poll.
            started: `time.perf_counter()` when `place` began, for `Plan.solve_seconds`.

        Returns:
            The plan.
        """
