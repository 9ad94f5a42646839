"""Plan diffs and fewest-moves relabelling."""

from __future__ import annotations

import json

import pytest

from serving.placement import ModelProfile, Move, Plan, ServerSpec, diff, fewest_moves, get_placer
from serving.placement.gpus import allocate_gpus

GIB = 1 << 30


def make_instance() -> tuple[list[ModelProfile], list[ServerSpec]]:
    servers = [ServerSpec(f"srv{i}", 4, 80 * GIB) for i in range(3)]
    models = [
        ModelProfile("pa", "producer", 2, lendable_bytes=20 * GIB),
        ModelProfile("pb", "producer", 1, lendable_bytes=12 * GIB),
        ModelProfile("pc", "producer", 1, lendable_bytes=9 * GIB),
        ModelProfile("ca", "consumer", 2, needed_bytes=18 * GIB),
        ModelProfile("cb", "consumer", 1, needed_bytes=10 * GIB),
        ModelProfile("cc", "consumer", 1, needed_bytes=8 * GIB),
    ]
    return models, servers


def test_it_needs_no_moves_when_the_current_placement_is_a_server_permutation_of_the_plan() -> None:
    models, servers = make_instance()
    plan = get_placer("cp-sat").place(models, servers)
    # deploy the plan with its servers rotated: same placement up to interchangeable servers
    rotate = {s.name: servers[(i + 1) % len(servers)].name for i, s in enumerate(servers)}
    current = {m: (rotate[a.server], a.gpus) for m, a in plan.assignments.items()}
    assert diff(current, plan) != []  # taken literally, the plan moves every model
    relabelled, moves = fewest_moves(current, plan)
    assert moves == []
    assert relabelled.objective == plan.objective
    for p in relabelled.pairings:  # pairings follow the relabelling
        assert p.server == relabelled.server_of(p.lender) == relabelled.server_of(p.borrower)
    summaries = {s.server: s for s in relabelled.server_summaries}
    for s in plan.server_summaries:
        assert summaries[rotate[s.server]].memory_balance_bytes == s.memory_balance_bytes


def test_it_keeps_gpu_indices_of_models_that_stay() -> None:
    models, servers = make_instance()
    plan = get_placer("cp-sat").place(models, servers)
    # current placement = the plan but with GPU indices within each server reversed
    current = {m: (a.server, tuple(3 - g for g in a.gpus)) for m, a in plan.assignments.items()}
    relabelled, moves = fewest_moves(current, plan)
    assert moves == []
    assert {m: a.gpus for m, a in relabelled.assignments.items()} == {
        m: tuple(sorted(g)) for m, (_, g) in current.items()
    }


def test_it_lists_start_move_and_stop() -> None:
    models, servers = make_instance()
    plan = get_placer("cp-sat").place(models, servers)
    pa = plan.assignments["pa"]
    other = next(s.name for s in servers if s.name != pa.server)
    current = {m: (a.server, a.gpus) for m, a in plan.assignments.items() if m not in ("cb", "pa")}
    current["pa"] = (other, (0, 1)) if pa.gpus != (0, 1) else (other, (2, 3))
    current["retired"] = (other, (3,))
    moves = diff(current, plan)
    cb = plan.assignments["cb"]
    assert moves == [
        Move("cb", "start", None, (), cb.server, cb.gpus),
        Move("pa", "move", other, current["pa"][1], pa.server, pa.gpus),
        Move("retired", "stop", other, (3,), None, ()),
    ]
    assert moves[0].to_dict()["kind"] == "start"


def test_it_moves_fewer_models_after_relabelling_than_before() -> None:
    models, servers = make_instance()
    plan = get_placer("cp-sat").place(models, servers)
    rotate = {s.name: servers[(i + 1) % len(servers)].name for i, s in enumerate(servers)}
    current = {m: (rotate[a.server], a.gpus) for m, a in plan.assignments.items()}
    # perturb: one model lives somewhere else now
    moved = "cc"
    elsewhere = next(s.name for s in servers if s.name != current[moved][0])
    current[moved] = (elsewhere, (3,))
    _, moves = fewest_moves(current, plan)
    assert [m.model for m in moves] == [moved]
    assert len(diff(current, plan)) > 1


def test_it_allocates_aligned_blocks_and_honours_valid_preferences() -> None:
    got = allocate_gpus(8, [("a", 1), ("b", 4), ("c", 2)])
    assert got == {"b": (0, 1, 2, 3), "c": (4, 5), "a": (6,)}
    # "a" keeps GPU 1; "b" prefers taken/out-of-range GPUs and is reallocated
    got = allocate_gpus(4, [("a", 1), ("b", 2)], {"a": [1], "b": [1, 9]})
    assert got["a"] == (1,) and got["b"] == (2, 3)


def test_a_stored_plan_round_trips_and_still_relabels() -> None:
    models, servers = make_instance()
    plan = get_placer("cp-sat").place(models, servers)
    stored = json.loads(json.dumps(plan.to_dict()))
    loaded = Plan.from_dict(stored)
    assert loaded == plan
    current = {m: (a.server, a.gpus) for m, a in plan.assignments.items()}
    assert fewest_moves(current, loaded)[1] == []
    with pytest.raises(ValueError, match="not a stored plan"):
        Plan.from_dict({"servers": []})


def test_a_model_planned_on_a_server_of_another_kind_is_a_move() -> None:
    # p runs on the 1-GPU server; the plan puts it on the 2-GPU one. Relabelling swaps servers only
    # within a kind, so nothing can keep p in place (it used to fail with a KeyError).
    servers = [ServerSpec("small", 1, 80 * GIB), ServerSpec("big", 2, 80 * GIB)]
    models = [ModelProfile("p", "producer", 2, lendable_bytes=20 * GIB)]
    plan = get_placer("cp-sat").place(models, servers)
    assert plan.server_of("p") == "big"
    relabelled, moves = fewest_moves({"p": ("small", (0,))}, plan)
    assert relabelled.server_of("p") == "big"
    assert [(m.kind, m.model, m.from_server, m.to_server) for m in moves] == [("move", "p", "small", "big")]
