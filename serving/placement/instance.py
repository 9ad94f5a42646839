"""A validated placement instance: integer weights, capacities, the objective and its lower bound.

Objective (what every placer minimises, in balance units of `PlacerConfig.balance_unit_bytes`):

    objective = max_s |mem_s| + role_weight * max_s |role_s|

    mem_s  = sum over models m on server s of w_ms,  w_ms = round(+lendable_ms or -needed_m / unit)
    role_s = (#producers on s) - (#consumers on s)

lendable_ms is what pairing lends from producer m on server s: its profile's figure, at most tp_m x
the memory of one of s's GPUs, and nothing on a server without NVLink, where pairing lends nothing
(`ModelProfile.lendable_on`). So a producer's weight depends on the GPU memory and the NVLink of its
server (servers of one GPU memory and NVLink form a "class"); a consumer's does not. w_m below is a
model's weight on the largest GPUs of NVLink servers (of any server when none has NVLink).

A model only goes on a server with at least tp_m GPUs, each with the memory it needs (its share of
its weights and minimal KV cache: `ModelProfile.gpu_memory_needed_bytes`); a model no server holds
is refused when the instance is built, naming it. Both terms are driven toward zero on the worst
server. `role_weight` defaults to the mean |w_m|
of the producers and consumers, so one surplus producer or consumer on a server costs as much as
an average one's memory. A neutral model (w_m = 0, role 0) only takes GPUs: it changes neither
term, nor the default weight, and is never paired.

Lower bounds on max_s |mem_s| (the larger one is used) and on max_s |role_s|:
  aggregate:     the per-server balances sum to W = sum w_ms and R = sum role_m over ALL S servers,
                 so max_s |mem_s| >= ceil(|W| / S) and max_s |role_s| >= ceil(|R| / S); W lies
                 between the sums of each model's least and greatest w_ms over the classes, so
                 the smallest |W| in that range is used;
  largest model: the server holding producer m has mem_s >= w_ms - (the most need that consumers
                 fitting in its other G_s - tp_m GPUs can add: a 0/1 knapsack over consumers with
                 tp as weight, G <= a few dozen so the DP is cheap); symmetrically for consumers.
                 This is what binds when one big TP model dominates its server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from serving.placement.inputs import ModelProfile, PlacementError, PlacerConfig, ServerSpec


def require_profiles(names: Iterable[str], profiles: Mapping[str, ModelProfile | None]) -> list[ModelProfile]:
    """The profiles of `names`, in order; raises PlacementError naming every model without one."""
    names = list(names)
    missing = [n for n in names if profiles.get(n) is None]
    if missing:
        raise PlacementError(f"models without a profile: {', '.join(sorted(missing))}")
    out: list[ModelProfile] = []
    for n in names:
        p = profiles[n]
        assert p is not None
        if p.name != n:
            raise PlacementError(f"profile for {n!r} is named {p.name!r}")
        out.append(p)
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class PlacementInstance:
    """Models (sorted by name) and servers (in the given order) with integer ILP data.

    Attributes:
        models: Profiles sorted by name; index i is "model i" everywhere below.
        servers: Server specs; index s is "server s".
        weights: w_m in balance units (signed), per model, on the largest GPUs of NVLink servers
            (of any server when none has NVLink; for ordering and the default role weight;
            balances use `weight`).
        roles: +1 producer / -1 consumer / 0 neutral, per model.
        tps: GPUs per model.
        capacities: GPUs per server.
        needs: Memory each GPU of a model's server must have, per model (0: any GPU holds it).
        gpu_memory: Memory of each GPU, per server.
        classes: The distinct (GPU memory, NVLink) of the servers, servers without NVLink first,
            then by ascending memory.
        server_class: Index into `classes` of each server's (GPU memory, NVLink).
        class_weights: class_weights[m][c] = w_ms in balance units for servers s of class c.
        role_weight: Weight of one unit of role imbalance, in balance units.
        unit_bytes: Bytes per balance unit.
    """

    models: tuple[ModelProfile, ...]
    servers: tuple[ServerSpec, ...]
    weights: tuple[int, ...]
    roles: tuple[int, ...]
    tps: tuple[int, ...]
    capacities: tuple[int, ...]
    needs: tuple[int, ...]
    gpu_memory: tuple[int, ...]
    classes: tuple[tuple[int, bool], ...]
    server_class: tuple[int, ...]
    class_weights: tuple[tuple[int, ...], ...]
    role_weight: int
    unit_bytes: int

    @classmethod
    def build(
        cls, models: Sequence[ModelProfile], servers: Sequence[ServerSpec], config: PlacerConfig
    ) -> PlacementInstance:
        """Validate the inputs; raises PlacementError naming the first problem found."""
        if not servers:
            raise PlacementError("no servers to place on")
        for m in models:
            if m is None:
                raise PlacementError("a model has no profile (profile it before placing)")
            if not isinstance(m, ModelProfile):
                raise PlacementError(f"expected a ModelProfile, got {m!r}")
        _no_duplicates([m.name for m in models], "model")
        _no_duplicates([s.name for s in servers], "server")
        largest = max(s.num_gpus for s in servers)
        too_big = sorted(m.name for m in models if m.tp > largest)
        if too_big:
            raise PlacementError(
                f"models need more GPUs than any server has ({largest}): {', '.join(too_big)}"
            )
        _fit_some_server(models, servers)
        needed, have = sum(m.tp for m in models), sum(s.num_gpus for s in servers)
        if needed > have:
            raise PlacementError(f"the models need {needed} GPUs but the servers have {have}")
        ordered = tuple(sorted(models, key=lambda m: m.name))
        unit = config.balance_unit_bytes
        # (memory, nvlink) ordered by (nvlink, memory): the last is the largest GPUs that can lend
        classes = tuple(sorted({(s.gpu_memory_bytes, s.nvlink) for s in servers}, key=lambda c: (c[1], c[0])))
        class_weights = tuple(tuple(round(m.balance_on(*c) / unit) for c in classes) for m in ordered)
        weights = tuple(row[-1] for row in class_weights)
        if config.role_weight_units is not None:
            role_weight = config.role_weight_units
        elif any(m.role_sign for m in ordered):
            lenders_and_borrowers = [abs(w) for m, w in zip(ordered, weights, strict=True) if m.role_sign]
            role_weight = max(1, round(sum(lenders_and_borrowers) / len(lenders_and_borrowers)))
        else:
            role_weight = 1
        return cls(
            models=ordered,
            servers=tuple(servers),
            weights=weights,
            roles=tuple(m.role_sign for m in ordered),
            tps=tuple(m.tp for m in ordered),
            capacities=tuple(s.num_gpus for s in servers),
            needs=tuple(m.gpu_memory_needed_bytes for m in ordered),
            gpu_memory=tuple(s.gpu_memory_bytes for s in servers),
            classes=classes,
            server_class=tuple(classes.index((s.gpu_memory_bytes, s.nvlink)) for s in servers),
            class_weights=class_weights,
            role_weight=role_weight,
            unit_bytes=unit,
        )

    @property
    def num_models(self) -> int:
        return len(self.models)

    @property
    def num_servers(self) -> int:
        return len(self.servers)

    def weight(self, m: int, s: int) -> int:
        """w_ms: model m's memory balance on server s, in balance units (module docstring)."""
        return self.class_weights[m][self.server_class[s]]

    def weight_matrix(self) -> np.ndarray:
        """w_ms for every model m (rows) and server s (columns), as int64."""
        by_class = np.array(self.class_weights, dtype=np.int64).reshape(self.num_models, len(self.classes))
        return by_class[:, np.array(self.server_class, dtype=np.int64)]

    def memory_lower_bound(self) -> int:
        """max(aggregate bound, largest-model bound); see the module docstring."""
        least = sum(min(row) for row in self.class_weights)
        greatest = sum(max(row) for row in self.class_weights)
        smallest_total = least if least > 0 else -greatest if greatest < 0 else 0
        bound = _ceil_div(smallest_total, self.num_servers)
        largest_gpus = max(self.capacities)
        # most |weight| that models of each sign can add within c GPUs, c = 0..largest_gpus, on
        # servers of each class
        most = {
            (sign, c): _knapsack(
                [
                    (self.tps[m], abs(self.class_weights[m][c]))
                    for m in range(self.num_models)
                    if self.roles[m] == sign
                ],
                largest_gpus,
            )
            for sign in (1, -1)
            for c in range(len(self.classes))
        }
        # per distinct size: O(models x sizes), not x servers
        sizes = sorted(set(zip(self.capacities, self.server_class, strict=True)))
        for m in range(self.num_models):
            if not self.roles[m]:
                continue  # a neutral model moves no balance
            worst_case = min(
                (
                    # models of the other role pull the balance back
                    abs(self.class_weights[m][c]) - most[-self.roles[m], c][cap - self.tps[m]]
                    for cap, c in sizes
                    if cap >= self.tps[m] and self.classes[c][0] >= self.needs[m]
                ),
                default=0,
            )
            bound = max(bound, worst_case)
        return bound

    def role_lower_bound(self) -> int:
        return _ceil_div(abs(sum(self.roles)), self.num_servers)

    def lower_bound(self) -> int:
        """A bound no placement can beat (see the module docstring)."""
        return self.memory_lower_bound() + self.role_weight * self.role_lower_bound()

    def balances(self, assignment: Sequence[int]) -> tuple[list[int], list[int]]:
        """Per-server (memory, role) balances of `assignment` (server index per model)."""
        mem = [0] * self.num_servers
        role = [0] * self.num_servers
        for m, s in enumerate(assignment):
            mem[s] += self.weight(m, s)
            role[s] += self.roles[m]
        return mem, role

    def objective(self, assignment: Sequence[int]) -> int:
        """The objective of a complete assignment (module docstring)."""
        mem, role = self.balances(assignment)
        return max(abs(v) for v in mem) + self.role_weight * max(abs(v) for v in role)

    def can_hold(self, m: int, s: int) -> bool:
        """Whether server s can hold model m alone: enough GPUs, each with the memory it needs."""
        return self.tps[m] <= self.capacities[s] and self.needs[m] <= self.gpu_memory[s]

    def fits(self, assignment: Sequence[int]) -> bool:
        """Whether no server holds more GPUs' worth of models than it has, nor a model its GPUs
        are too small for."""
        used = [0] * self.num_servers
        for m, s in enumerate(assignment):
            used[s] += self.tps[m]
            if self.needs[m] > self.gpu_memory[s]:
                return False
        return all(u <= c for u, c in zip(used, self.capacities, strict=True))


def _fit_some_server(models: Sequence[ModelProfile], servers: Sequence[ServerSpec]) -> None:
    """PlacementError naming every model whose share of weights and minimal KV cache exceeds the
    memory of each GPU of every server with enough GPUs for it (placed there, it could not start)."""
    problems = []
    for m in sorted(models, key=lambda m: m.name):
        largest = max((s.gpu_memory_bytes for s in servers if s.num_gpus >= m.tp), default=0)
        need = m.gpu_memory_needed_bytes
        if need > largest:
            problems.append(
                f"{m.name} needs {_gib(need)} per GPU (weights {_gib(m.weights_bytes)} + minimal KV "
                f"cache {_gib(m.min_kv_bytes)} over tp {m.tp}) but the largest GPU of a server with "
                f"{m.tp} or more GPUs has {_gib(largest)}"
            )
    if problems:
        raise PlacementError(f"models that fit no server's GPU memory: {'; '.join(problems)}")


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB ({nbytes} bytes)"


def _knapsack(items: list[tuple[int, int]], capacity: int) -> list[int]:
    """best[c] = the largest total value of items (size, value), each used once, within size c."""
    best = [0] * (capacity + 1)
    for size, value in items:
        for c in range(capacity, size - 1, -1):
            best[c] = max(best[c], best[c - size] + value)
    return best


def _no_duplicates(names: list[str], what: str) -> None:
    dup = sorted(n for n, k in Counter(names).items() if k > 1)
    if dup:
        raise PlacementError(f"duplicate {what} names: {', '.join(dup)}")
