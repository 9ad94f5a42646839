"""Plan vs. current placement: the moves, and relabelling a plan so it needs the fewest of them.

Servers of one kind (GPU count, GPU memory, NVLink) are interchangeable, so a plan's server names
are arbitrary within a kind. `relabel_for_fewest_moves` permutes them, per kind, to maximise the
number of models that stay where they run now: an assignment problem over (plan server, real
server) with weight = models they share, solved exactly by scipy's linear_sum_assignment. Models
that stay on their server keep their GPU indices when they still fit. Balances, pairings and the
objective are unchanged by the permutation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from serving.placement.gpus import allocate_gpus
from serving.placement.plan import Assignment, Plan

# model -> (server, GPU indices) as deployed now
CurrentPlacement = Mapping[str, tuple[str, Sequence[int]]]
MoveKind = Literal["start", "move", "stop"]


@dataclass(frozen=True, slots=True)
class Move:
    """One change to apply: start a model, move it (server or GPUs), or stop it.

    Attributes:
        model: The model.
        kind: "start" (not running now), "move" (runs elsewhere now) or "stop" (not in the plan).
        from_server: Where it runs now (None for "start").
        from_gpus: Its GPUs now (empty for "start").
        to_server: Where the plan puts it (None for "stop").
        to_gpus: Its GPUs in the plan (empty for "stop").
    """

    model: str
    kind: MoveKind
    from_server: str | None
    from_gpus: tuple[int, ...]
    to_server: str | None
    to_gpus: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "kind": self.kind,
            "from_server": self.from_server,
            "from_gpus": list(self.from_gpus),
            "to_server": self.to_server,
            "to_gpus": list(self.to_gpus),
        }


def diff(current: CurrentPlacement, plan: Plan) -> list[Move]:
    """The moves that turn `current` into `plan`, sorted by model name; [] when they agree."""
    moves: list[Move] = []
    for model in sorted(set(current) | set(plan.assignments)):
        now = current.get(model)
        target = plan.assignments.get(model)
        now_gpus = tuple(sorted(now[1])) if now is not None else ()
        if target is None:
            assert now is not None
            moves.append(Move(model, "stop", now[0], now_gpus, None, ()))
        elif now is None:
            moves.append(Move(model, "start", None, (), target.server, target.gpus))
        elif (now[0], now_gpus) != (target.server, target.gpus):
            moves.append(Move(model, "move", now[0], now_gpus, target.server, target.gpus))
    return moves


def relabel_for_fewest_moves(current: CurrentPlacement, plan: Plan) -> Plan:
    """The same plan with its servers permuted within each kind to keep the most models in place."""
    by_kind: dict[tuple[int, int, bool], list[str]] = defaultdict(list)
    for server in plan.servers:
        by_kind[server.kind].append(server.name)
    # planned server -> real server
    rename: dict[str, str] = {}
    for names in by_kind.values():
        index = {n: i for i, n in enumerate(names)}
        shared = np.zeros((len(names), len(names)), dtype=np.int64)
        for model, a in plan.assignments.items():
            now = current.get(model)
            # Only a model planned on a server of this kind and running on one can stay put.
            if now is not None and now[0] in index and a.server in index:
                shared[index[a.server], index[now[0]]] += 1
        rows, cols = linear_sum_assignment(shared, maximize=True)
        rename.update({names[i]: names[j] for i, j in zip(rows.tolist(), cols.tolist(), strict=True)})

    num_gpus = {s.name: s.num_gpus for s in plan.servers}
    order = {s.name: i for i, s in enumerate(plan.servers)}
    demands: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for model, a in plan.assignments.items():
        demands[rename[a.server]].append((model, len(a.gpus)))
    new_gpus: dict[str, tuple[int, ...]] = {}
    for target, models in demands.items():
        keep = {m: current[m][1] for m, _ in models if m in current and current[m][0] == target}
        new_gpus.update(allocate_gpus(num_gpus[target], models, keep))

    assignments = {
        m: Assignment(m, rename[a.server], new_gpus[m]) for m, a in sorted(plan.assignments.items())
    }
    pairings = sorted(
        (
            replace(
                p,
                server=rename[p.server],
                lender_gpus=new_gpus[p.lender],
                borrower_gpus=new_gpus[p.borrower],
            )
            for p in plan.pairings
        ),
        key=lambda p: (order[p.server], p.lender),
    )
    fallbacks = sorted(
        (replace(f, server=rename[f.server], gpus=new_gpus[f.model]) for f in plan.dram_fallbacks),
        key=lambda f: (order[f.server], f.model),
    )
    summary_of = {rename[s.server]: replace(s, server=rename[s.server]) for s in plan.server_summaries}
    return replace(
        plan,
        assignments=assignments,
        pairings=tuple(pairings),
        dram_fallbacks=tuple(fallbacks),
        server_summaries=tuple(summary_of[s.name] for s in plan.servers),
    )


def fewest_moves(current: CurrentPlacement, plan: Plan) -> tuple[Plan, list[Move]]:
    """Relabel `plan` for the fewest moves, then diff it against `current`."""
    relabelled = relabel_for_fewest_moves(current, plan)
    return relabelled, diff(current, relabelled)
