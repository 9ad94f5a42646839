"""The CP-SAT placer's time limit covers the whole solve, building its ILP included."""

from __future__ import annotations

import random
import time

import pytest

from serving.placement import ModelProfile, PlacerConfig, ServerSpec, get_placer
from serving.placement.greedy import greedy_assignment
from serving.placement.instance import PlacementInstance
from serving.placement.local_search import spread_greedy

GIB = 1 << 30


def cluster(servers: int, models: int, seed: int = 0) -> tuple[list[ModelProfile], list[ServerSpec]]:
    rng = random.Random(seed)
    specs = [ServerSpec(f"srv{i:03d}", 8, 80 * GIB) for i in range(servers)]
    out = []
    for i in range(models):
        tp = rng.choice([1, 1, 2])
        if i % 2:
            out.append(ModelProfile(f"m{i:04d}", "consumer", tp, needed_bytes=rng.randint(5, 40) * GIB))
        else:
            out.append(ModelProfile(f"m{i:04d}", "producer", tp, lendable_bytes=rng.randint(20, 60) * GIB))
    return out, specs


def test_it_answers_within_its_time_limit_when_its_ilp_cannot_be_built_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1500 models on 250 servers: about 190k literals, seconds of Python to build. A 0.5 s place
    # job took 5 s here (it built the whole ILP, then searched past the limit).
    from ortools.sat.python import cp_model

    def no_search(*args: object, **kwargs: object) -> None:
        raise AssertionError("CP-SAT searched after the time limit was spent building its ILP")

    monkeypatch.setattr(cp_model.CpSolver, "solve", no_search)
    models, servers = cluster(250, 1500)
    limit = 0.5
    started = time.perf_counter()
    plan = get_placer("cp-sat", PlacerConfig(time_limit_s=limit)).place(models, servers)
    took = time.perf_counter() - started
    assert took < 2 * limit, f"took {took:.2f} s with a {limit} s limit"
    # the hint is the plan: complete, no server over its GPUs
    assert set(plan.assignments) == {m.name for m in models}
    assert plan.hint_objective == plan.objective and plan.status == "feasible"
    assert all(s.gpus_used <= s.num_gpus for s in plan.server_summaries)
    assert plan.best_bound <= plan.objective


@pytest.mark.parametrize("seed", range(3))
def test_its_hints_are_the_ones_its_per_server_loops_built(seed: int) -> None:
    # greedy_assignment and spread_greedy score every server at once (numpy); this is the loop
    # over servers they replaced (greedy.py and local_search.py document the keys), on instances
    # with ties, neutral models and more than one server size.
    rng = random.Random(seed)
    servers = [ServerSpec(f"s{i}", rng.choice([2, 4, 8]), 80 * GIB) for i in range(rng.randint(1, 12))]
    models = []
    for i in range(sum(s.num_gpus for s in servers) // 2):
        tp = rng.choice([1, 1, 2])
        kind = rng.randrange(3)  # few sizes: ties between servers
        if kind == 0:
            models.append(ModelProfile(f"m{i}", "producer", tp, lendable_bytes=rng.randint(1, 3) * GIB))
        elif kind == 1:
            models.append(ModelProfile(f"m{i}", "consumer", tp, needed_bytes=rng.randint(1, 3) * GIB))
        else:
            models.append(ModelProfile(f"m{i}", "neutral", tp))
    inst = PlacementInstance.build(models, servers, PlacerConfig())
    assert greedy_assignment(inst) == _loop_greedy(inst)
    assert spread_greedy(inst) == _loop_spread(inst)


def _order(inst: PlacementInstance) -> list[int]:
    return sorted(
        range(inst.num_models), key=lambda m: (-inst.tps[m], -abs(inst.weights[m]), inst.models[m].name)
    )


def _loop_greedy(inst: PlacementInstance) -> list[int]:
    n = inst.num_servers
    mem, role, used, out = [0] * n, [0] * n, [0] * n, [-1] * inst.num_models
    rw = inst.role_weight
    for m in _order(inst):
        w, r, tp = inst.weights[m], inst.roles[m], inst.tps[m]
        keys = []
        for s in range(n):
            if used[s] + tp > inst.capacities[s]:
                continue
            others = [t for t in range(n) if t != s]
            worst_mem = max([abs(mem[s] + w)] + [abs(mem[t]) for t in others])
            worst_role = max([abs(role[s] + r)] + [abs(role[t]) for t in others])
            keys.append((worst_mem + rw * worst_role, abs(mem[s] + w) + rw * abs(role[s] + r), s))
        s = min(keys)[2]
        out[m], mem[s], role[s], used[s] = s, mem[s] + w, role[s] + r, used[s] + tp
    return out


def _loop_spread(inst: PlacementInstance) -> list[int]:
    n = inst.num_servers
    mem_mean, role_mean = sum(inst.weights) / n, sum(inst.roles) / n
    rw2 = inst.role_weight**2
    mem, role, used, out = [0.0] * n, [0.0] * n, [0] * n, [-1] * inst.num_models
    for m in _order(inst):
        w, r, tp = inst.weights[m], inst.roles[m], inst.tps[m]
        s = min(
            (w * (2 * (mem[s] - mem_mean) + w) + rw2 * r * (2 * (role[s] - role_mean) + r), s)
            for s in range(n)
            if used[s] + tp <= inst.capacities[s]
        )[1]
        out[m], mem[s], role[s], used[s] = s, mem[s] + w, role[s] + r, used[s] + tp
    return out


def test_its_search_budget_does_not_depend_on_how_long_its_hint_took(monkeypatch: pytest.MonkeyPatch) -> None:
    # The search stops after a deterministic amount of work so that one input gives one plan: that
    # amount must not be drawn from the wall-clock seconds left after the hint (they vary with the
    # machine's load), or a slower hint moves the stop and so the plan.
    from ortools.sat.python import cp_model

    from serving.placement import cpsat

    budgets: list[float] = []
    solve = cp_model.CpSolver.solve

    def recording(
        self: cp_model.CpSolver,
        model: cp_model.CpModel,
        callback: cp_model.CpSolverSolutionCallback | None = None,
    ) -> object:
        budgets.append(self.parameters.max_deterministic_time)
        return solve(self, model, callback)

    monkeypatch.setattr(cp_model.CpSolver, "solve", recording)
    models, servers = cluster(4, 12)
    config = PlacerConfig(time_limit_s=2.0, num_workers=1)
    get_placer("cp-sat", config).place(models, servers)

    def slow_spread_greedy(instance: PlacementInstance) -> list[int]:
        time.sleep(0.4)  # a loaded machine
        return spread_greedy(instance)

    monkeypatch.setattr(cpsat, "spread_greedy", slow_spread_greedy)
    get_placer("cp-sat", config).place(models, servers)
    assert len(budgets) == 2 and budgets[0] == budgets[1] > 0
