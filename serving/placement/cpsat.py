"""Aqua's placement ILP on OR-Tools CP-SAT.

Variables: x[m, s] in {0, 1} (model m on server s), created only where tp_m <= G_s and each GPU of
s has the memory m needs (instance.needs).
Constraints:
    sum_s x[m, s] = 1                         every model on exactly one server (all its TP shards)
    sum_m tp_m x[m, s] <= G_s                 GPU capacity
    M_mem  >= +-sum_m w_ms x[m, s]            M_mem  = max_s |memory balance|   (balance units; a
                                              producer's w_ms is what pairing lends on s: instance.py)
    M_role >= +-sum_m r_m x[m, s]             M_role = max_s |role balance|
    M_mem >= ceil(|W| / S), M_role >= ceil(|R| / S)   the aggregate bound (redundant, helps the
                                              solver prove optimality; see instance.py)
Objective: minimise M_mem + role_weight * M_role (instance.py documents the weighting).

Symmetry breaking: servers of one kind are interchangeable, so any solution can be relabelled to
put the servers of a kind in order of the first (lowest-index) model they hold; then model m can
only sit on the first m + 1 servers of each kind: x[m, s_i] = 0 for i > m.

Hint: the naive greedy (greedy.py) and a spread-minimising greedy are built, the better one is
improved by local search (local_search.py, at most half the time limit), relabelled as above and
given to CP-SAT as a solution hint. The time limit covers the whole solve: the hint is built
first, and when the ILP (O(models x servers) literals) would not be built within the limit (as
projected from the literals built so far), or leaves no time to search, the hint is the plan.

Reproducibility: the hint is deterministic (unless its local search hits its deadline); when the
search does not beat it, the hint is the plan. The search is deterministic too: it stops after a
deterministic amount of work (CP-SAT's deterministic time, a quarter of the time limit) and runs
its workers interleaved (CP-SAT's interleave_search), so one input gives one plan however loaded
the machine is, unless the wall-clock limit, a cap, stops the search first.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import replace

from ortools.sat.python import cp_model

from serving.placement.assemble import assemble_plan
from serving.placement.base import CancelFn, Placer, ProgressFn
from serving.placement.greedy import greedy_assignment
from serving.placement.inputs import PlacementCancelled, PlacementError
from serving.placement.instance import PlacementInstance
from serving.placement.local_search import improve, spread_greedy
from serving.placement.plan import Plan
from serving.placement.registry import register_placer

_POLL_S = 0.05  # how often cancellation is polled
_PROGRESS_EVERY_S = 0.5  # how often progress is reported while searching
_LOCAL_SEARCH_SHARE = 0.5  # of the time limit, at most, spent on the hint's local search
# CP-SAT's deterministic time (about seconds of one core's work) allowed per second of the time
# limit (not of the seconds left when the search starts, which vary with the load): low enough that
# the deterministic stop, not the wall clock, ends the search on a loaded machine (interleaved
# workers checked it only between batches, overshooting it by up to 2x, at 0.3 to 0.7
# deterministic seconds per wall-clock second on 2 shared cores).
_DETERMINISTIC_SHARE = 0.25


class _Incumbent(cp_model.CpSolverSolutionCallback):
    """Records the latest objective so the caller's thread can report it."""

    def __init__(self) -> None:
        super().__init__()
        self.objective: float | None = None
        self.solutions = 0

    def on_solution_callback(self) -> None:
        self.objective = self.objective_value
        self.solutions += 1


def canonical_relabel(instance: PlacementInstance, assignment: list[int]) -> list[int]:
    """Permute servers of each kind so they appear in order of their lowest-index model."""
    by_kind: dict[tuple[int, int, bool], list[int]] = defaultdict(list)
    for s, server in enumerate(instance.servers):
        by_kind[server.kind].append(s)
    first: dict[int, int] = {}
    for m, s in enumerate(assignment):
        first.setdefault(s, m)
    mapping: dict[int, int] = {}
    for group in by_kind.values():
        ordered = sorted(group, key=lambda s: (first.get(s, instance.num_models), s))
        mapping.update(zip(ordered, group, strict=True))
    return [mapping[s] for s in assignment]


def _num_literals(instance: PlacementInstance, kind_rank: list[int]) -> int:
    """How many x[m, s] `_build` creates: per model, the servers that can hold it, less the servers
    of a kind past its m-th (symmetry breaking)."""
    per_kind: dict[tuple[int, int], list[int]] = defaultdict(list)  # (GPUs, memory) -> kind sizes
    kinds: dict[tuple[int, int, bool], int] = defaultdict(int)
    for server, rank in zip(instance.servers, kind_rank, strict=True):
        kinds[server.kind] = max(kinds[server.kind], rank + 1)
    for kind, size in kinds.items():
        per_kind[kind[0], kind[1]].append(size)
    return sum(
        min(size, m + 1)
        for m, (tp, need) in enumerate(zip(instance.tps, instance.needs, strict=True))
        for (cap, memory), sizes in per_kind.items()
        if tp <= cap and need <= memory
        for size in sizes
    )


@register_placer("cp-sat")
class CpSatPlacer(Placer):
    """The ILP placer: CP-SAT with a local-search hint, within `PlacerConfig.time_limit_s`."""

    def solve(
        self, instance: PlacementInstance, progress: ProgressFn, should_cancel: CancelFn, started: float
    ) -> Plan:
        if instance.num_models == 0:
            return assemble_plan(
                instance, [], best_bound=0, status="optimal", solver=self.name, solve_seconds=0.0
            )
        # the time limit covers the whole solve: validation, hint, building the ILP and search
        deadline = started + self.config.time_limit_s
        hint = self._hint(instance, should_cancel, started)
        built = self._build(instance, hint, deadline, should_cancel)
        remaining = deadline - time.perf_counter()
        if built is None or remaining <= 0:
            # Building the ILP (O(models x servers) variables) used up the time limit: the hint is
            # the plan. Searching on past the limit made a 1 s place job of 2000 models on 250
            # servers take 7 s (measured).
            return self._hint_plan(instance, hint, started)
        model, x = built
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.max_time_in_seconds = remaining
        # Reproducible plans: the search stops after an amount of CP-SAT's deterministic time (its
        # own work count) and runs its workers interleaved, in a fixed order; the wall clock is
        # only a cap. Stopped by the wall clock, parallel workers returned a different plan on each
        # run of one input (measured: 128 models, 10 s, 2 workers: objectives 44966, 44765, 44897;
        # interleaved: 19199 on each run, in 4 to 7 s).
        # The budget is a share of the configured limit, not of the seconds left: those depend on
        # how long the hint and the ILP took on this machine, and a budget drawn from them made
        # the deterministic stop (and so the plan) move with the load (measured: 0.499 vs 0.398
        # deterministic seconds for one input, its hint 0.4 s slower on the second run).
        params.max_deterministic_time = self.config.time_limit_s * _DETERMINISTIC_SHARE
        params.num_workers = self.config.num_workers
        params.interleave_search = self.config.num_workers > 1
        params.random_seed = self.config.seed
        params.relative_gap_limit = self.config.relative_gap_limit
        incumbent = _Incumbent()
        status = self._run(solver, model, incumbent, progress, should_cancel, started)
        if status == "cancelled":
            raise PlacementCancelled("placement cancelled while solving")
        if status == cp_model.INFEASIBLE:
            raise PlacementError(
                f"infeasible: the models ({sum(instance.tps)} GPUs, largest tp {max(instance.tps)}) "
                f"cannot be packed onto the servers' GPUs (each on GPUs with the memory it needs)"
            )
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return self._hint_plan(instance, hint, started)  # nothing better than the hint in time
        values = solver.response_proto.solution
        assignment = [next(s for s, var in row.items() if values[var.index]) for row in x]
        bound = max(instance.lower_bound(), int(-(-solver.best_objective_bound // 1)))
        if hint is not None and instance.objective(hint) <= instance.objective(assignment):
            # Multi-threaded CP-SAT may return a different solution of the same objective on
            # each run; the hint is reproducible, so prefer it unless the search beat it.
            assignment = hint
        return self._plan(instance, assignment, bound, started, hint)

    def _hint_plan(self, instance: PlacementInstance, hint: list[int] | None, started: float) -> Plan:
        """The plan of the hint, when the search found nothing (better) within the time limit."""
        if hint is None:
            raise PlacementError(
                f"no feasible placement found within {self.config.time_limit_s}s "
                f"({instance.num_models} models on {instance.num_servers} servers); raise the time limit"
            )
        return self._plan(instance, hint, instance.lower_bound(), started, hint)

    def _plan(
        self,
        instance: PlacementInstance,
        assignment: list[int],
        bound: int,
        started: float,
        hint: list[int] | None,
    ) -> Plan:
        """The plan of ``assignment``: optimal when its objective reaches ``bound``."""
        objective = instance.objective(assignment)
        plan = assemble_plan(
            instance,
            assignment,
            best_bound=min(bound, objective),
            status="optimal" if objective <= bound else "feasible",
            solver=self.name,
            solve_seconds=time.perf_counter() - started,
        )
        return replace(plan, hint_objective=None if hint is None else instance.objective(hint))

    def _build(
        self,
        instance: PlacementInstance,
        hint: list[int] | None,
        deadline: float,
        should_cancel: CancelFn,
    ) -> tuple[cp_model.CpModel, list[dict[int, cp_model.IntVar]]] | None:
        """The ILP, hinted with `hint`; None if `deadline` passed while building it."""
        model = cp_model.CpModel()
        kind_rank: list[int] = []  # server s is the kind_rank[s]-th server of its kind
        seen: dict[tuple[int, int, bool], int] = defaultdict(int)
        for server in instance.servers:
            kind_rank.append(seen[server.kind])
            seen[server.kind] += 1
        # x[m] : server index -> literal, only for servers that can hold the model
        x: list[dict[int, cp_model.IntVar]] = []
        on_server: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in instance.servers]
        total = _num_literals(instance, kind_rank)
        done = 0
        began = time.perf_counter()
        for m in range(instance.num_models):
            if m % 16 == 0:
                now = time.perf_counter()
                # Give up as soon as the literals built so far show the rest will not be built in
                # time: a model given up on late is also slow to free (a tenth of its build time).
                if now >= deadline or (done and now + (now - began) * (total - done) / done > deadline):
                    return None
                if should_cancel():
                    raise PlacementCancelled("placement cancelled while building the ILP")
            row = {
                s: model.new_bool_var(f"x_{m}_{s}")
                for s in range(instance.num_servers)
                if instance.can_hold(m, s) and kind_rank[s] <= m
            }
            model.add_exactly_one(row.values())
            x.append(row)
            for s, var in row.items():
                on_server[s].append((m, var))
            done += len(row)
        total_abs = sum(max(abs(w) for w in row) for row in instance.class_weights)
        m_mem = model.new_int_var(instance.memory_lower_bound(), max(total_abs, 0), "max_mem")
        m_role = model.new_int_var(instance.role_lower_bound(), instance.num_models, "max_role")
        weighted_sum = cp_model.LinearExpr.weighted_sum
        for s, here in enumerate(on_server):
            if time.perf_counter() >= deadline:
                return None
            lits = [v for _, v in here]
            model.add(weighted_sum(lits, [instance.tps[m] for m, _ in here]) <= instance.capacities[s])
            mem = weighted_sum(lits, [instance.weight(m, s) for m, _ in here])
            role = weighted_sum(lits, [instance.roles[m] for m, _ in here])
            model.add(m_mem >= mem)
            model.add(m_mem >= -mem)
            model.add(m_role >= role)
            model.add(m_role >= -role)
        model.minimize(m_mem + instance.role_weight * m_role)

        if hint is not None:
            # straight into the proto: add_hint per literal took over a second for 260k literals
            hinted = model.proto.solution_hint
            for m, row in enumerate(x):
                hinted.vars.extend(var.index for var in row.values())
                hinted.values.extend(int(s == hint[m]) for s in row)
        return model, x

    def _hint(self, instance: PlacementInstance, should_cancel: CancelFn, started: float) -> list[int] | None:
        """The better of the naive greedy and the local-search solution, canonically relabelled;
        None if neither packs the models (CP-SAT then searches unhinted)."""
        candidates: list[list[int]] = []
        deadline = started + self.config.time_limit_s * _LOCAL_SEARCH_SHARE
        for build in (greedy_assignment, spread_greedy):
            try:
                candidates.append(build(instance))
            except PlacementError:
                continue
        if not candidates:
            return None
        start = min(candidates, key=instance.objective)
        best = improve(instance, start, deadline, should_cancel)
        return canonical_relabel(instance, best)

    def _run(
        self,
        solver: cp_model.CpSolver,
        model: cp_model.CpModel,
        incumbent: _Incumbent,
        progress: ProgressFn,
        should_cancel: CancelFn,
        started: float,
    ) -> int | str:
        """Solve on a worker thread; poll cancellation and report progress on this thread."""
        result: dict[str, int] = {}

        def work() -> None:
            result["status"] = int(solver.solve(model, incumbent))

        worker = threading.Thread(target=work, name="cp-sat", daemon=True)
        worker.start()
        cancelled = False
        reported = -_PROGRESS_EVERY_S
        try:
            while worker.is_alive():
                worker.join(_POLL_S)
                if not cancelled and should_cancel():
                    cancelled = True
                    solver.stop_search()
                elapsed = time.perf_counter() - started
                if elapsed - reported < _PROGRESS_EVERY_S:
                    continue
                reported = elapsed
                frac = min(0.99, elapsed / self.config.time_limit_s)
                best = "none yet" if incumbent.objective is None else f"{incumbent.objective:.0f}"
                progress(frac, f"CP-SAT searching: best objective {best}, {incumbent.solutions} solutions")
        except BaseException:
            solver.stop_search()  # a callback raised: do not leave the search running
            worker.join()
            raise
        if cancelled:
            return "cancelled"
        return result["status"]
