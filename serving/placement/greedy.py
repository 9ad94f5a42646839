"""Greedy baseline: place models one by one where the worst server stays least imbalanced.

Order: largest tp first (they are the hardest to fit), then largest |balance|, then name. Each model
goes to the server, among those with enough free GPUs, that minimises (the objective after placing
it, that server's own |mem| + role_weight * |role|, server index). O(models x servers).
"""

from __future__ import annotations

import time

from serving.placement.assemble import assemble_plan
from serving.placement.base import CancelFn, Placer, ProgressFn
from serving.placement.inputs import PlacementCancelled, PlacementError
from serving.placement.instance import PlacementInstance
from serving.placement.plan import Plan
from serving.placement.registry import register_placer


def greedy_assignment(instance: PlacementInstance, should_cancel: CancelFn | None = None) -> list[int]:
    """Server index per model (instance order), built greedily.

    Raises:
        PlacementError: Some model finds no server with enough free GPUs (greedy packing can fail
            on instances an exact solver still packs).
        PlacementCancelled: `should_cancel` returned True.
    """
    n_servers = instance.num_servers
    mem = [0] * n_servers
    role = [0] * n_servers
    used = [0] * n_servers
    out = [-1] * instance.num_models
    order = sorted(
        range(instance.num_models),
        key=lambda m: (-instance.tps[m], -abs(instance.weights[m]), instance.models[m].name),
    )
    rw = instance.role_weight
    for k, m in enumerate(order):
        if should_cancel is not None and k % 64 == 0 and should_cancel():
            raise PlacementCancelled("placement cancelled during the greedy pass")
        w, r, tp = instance.weights[m], instance.roles[m], instance.tps[m]
        best: tuple[int, int, int] | None = None
        mem_top, role_top = _top2_abs(mem), _top2_abs(role)
        for s in range(n_servers):
            if used[s] + tp > instance.capacities[s]:
                continue
            new_mem, new_role = mem[s] + w, role[s] + r
            worst_mem = max(abs(new_mem), _other(mem_top, s))
            worst_role = max(abs(new_role), _other(role_top, s))
            key = (worst_mem + rw * worst_role, abs(new_mem) + rw * abs(new_role), s)
            if best is None or key < best:
                best = key
        if best is None:
            raise PlacementError(
                f"greedy placement found no server with {tp} free GPUs for model {instance.models[m].name!r}"
            )
        s = best[2]
        out[m] = s
        mem[s] += w
        role[s] += r
        used[s] += tp
    return out


def _top2_abs(values: list[int]) -> list[tuple[int, int]]:
    """The two largest (|value|, index) pairs, largest first."""
    return sorted(((abs(v), i) for i, v in enumerate(values)), key=lambda t: (-t[0], t[1]))[:2]


def _other(top2: list[tuple[int, int]], skip: int) -> int:
    """max |value| over all indices except `skip`, from `_top2_abs`."""
    for value, index in top2:
        if index != skip:
            return value
    return 0


@register_placer("greedy")
class GreedyPlacer(Placer):
    """The greedy baseline as a placer; its bound is the aggregate lower bound."""

    def solve(
        self, instance: PlacementInstance, progress: ProgressFn, should_cancel: CancelFn, started: float
    ) -> Plan:
        assignment = greedy_assignment(instance, should_cancel)
        bound = instance.lower_bound()
        return assemble_plan(
            instance,
            assignment,
            best_bound=bound,
            status="optimal" if instance.objective(assignment) <= bound else "heuristic",
            solver=self.name,
            solve_seconds=time.perf_counter() - started,
        )
