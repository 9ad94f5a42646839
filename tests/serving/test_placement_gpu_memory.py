"""The placer only puts a model on GPUs that hold its share of weights and a minimal KV cache."""

from __future__ import annotations

import random

import pytest

from serving.placement import ModelProfile, PlacementError, PlacerConfig, Plan, ServerSpec, get_placer
from serving.placement.instance import PlacementInstance
from serving.placement.local_search import improve

GIB = 1 << 30
PLACERS = ["cp-sat", "greedy"]


def place(placer: str, models: list[ModelProfile], servers: list[ServerSpec]) -> Plan:
    return get_placer(placer, PlacerConfig(time_limit_s=5.0, num_workers=1)).place(models, servers)


@pytest.mark.parametrize("placer", PLACERS)
def test_a_model_goes_to_the_only_server_whose_gpus_hold_it(placer: str) -> None:
    # Placed first (largest balance) on the lowest-index server of equal score: the 24 GiB one,
    # where 30 GiB of weights cannot load.
    servers = [ServerSpec("small", 1, 24 * GIB), ServerSpec("large", 1, 80 * GIB)]
    models = [
        ModelProfile("big", "producer", 1, lendable_bytes=20 * GIB, weights_bytes=30 * GIB, min_kv_bytes=GIB),
        ModelProfile("tiny", "consumer", 1, needed_bytes=5 * GIB),
    ]
    plan = place(placer, models, servers)
    assert plan.assignments["big"].server == "large"
    assert plan.assignments["tiny"].server == "small"


@pytest.mark.parametrize("placer", PLACERS)
def test_tensor_parallelism_splits_the_need_over_the_gpus(placer: str) -> None:
    # 60 GiB of weights + 4 GiB of KV over tp 2: 32 GiB per GPU; fits 40 GiB GPUs, not 24 GiB ones.
    servers = [ServerSpec("s24", 2, 24 * GIB), ServerSpec("s40", 2, 40 * GIB)]
    models = [
        ModelProfile(
            "a", "producer", 2, lendable_bytes=8 * GIB, weights_bytes=60 * GIB, min_kv_bytes=4 * GIB
        ),
        ModelProfile("b", "neutral", 2),
    ]
    plan = place(placer, models, servers)
    assert plan.assignments["a"].server == "s40"


@pytest.mark.parametrize("placer", PLACERS)
def test_a_model_that_fits_no_gpu_is_a_named_error(placer: str) -> None:
    servers = [ServerSpec("s24", 4, 24 * GIB), ServerSpec("s40", 1, 40 * GIB)]
    models = [
        # 40 GiB per GPU: the 40 GiB server has too few GPUs, the others too little memory
        ModelProfile("huge", "neutral", 2, weights_bytes=76 * GIB, min_kv_bytes=4 * GIB),
        ModelProfile("ok", "neutral", 1, weights_bytes=20 * GIB),
    ]
    with pytest.raises(PlacementError, match=r"huge needs 40\.00 GiB .* per GPU .* has 24\.00 GiB") as err:
        place(placer, models, servers)
    assert "ok" not in str(err.value).split("memory:")[1]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("placer", PLACERS)
def test_no_placer_puts_a_model_on_gpus_too_small_for_it(placer: str, seed: int) -> None:
    rng = random.Random(seed)
    servers = [ServerSpec(f"s{i}", rng.choice([2, 4]), rng.choice([24, 48, 80]) * GIB) for i in range(4)] + [
        ServerSpec("big", 4, 80 * GIB)
    ]
    models = []
    for i in range(10):
        tp = rng.choice([1, 1, 2])
        need = rng.choice([0, 0, 10, 30, 60]) * GIB * tp
        if i % 2:
            models.append(
                ModelProfile(
                    f"m{i}", "producer", tp, lendable_bytes=rng.randint(1, 40) * GIB, weights_bytes=need
                )
            )
        else:
            models.append(
                ModelProfile(
                    f"m{i}", "consumer", tp, needed_bytes=rng.randint(1, 40) * GIB, weights_bytes=need
                )
            )
    memory = {s.name: s.gpu_memory_bytes for s in servers}
    try:
        plan = place(placer, models, servers)
    except PlacementError:
        pytest.skip("no packing within the GPUs that hold the models")
    for m in models:
        assert m.gpu_memory_needed_bytes <= memory[plan.assignments[m.name].server], m.name


def test_local_search_never_moves_a_model_onto_gpus_too_small_for_it() -> None:
    # Balance alone moves "big" (lending 40 GiB) next to the consumers on the 24 GiB server.
    servers = [ServerSpec("s24", 4, 24 * GIB), ServerSpec("s80", 4, 80 * GIB)]
    models = [ModelProfile("big", "producer", 1, lendable_bytes=40 * GIB, weights_bytes=50 * GIB)] + [
        ModelProfile(f"c{i}", "consumer", 1, needed_bytes=10 * GIB) for i in range(4)
    ]
    instance = PlacementInstance.build(models, servers, PlacerConfig())
    start = [1, 0, 0, 0, 0]  # the producer on s80, the consumers on s24
    out = improve(instance, start, deadline=float("inf"))
    assert out[0] == 1
    assert instance.fits(out)
    assert not instance.fits([0, 1, 1, 1, 1])


@pytest.mark.parametrize("placer", PLACERS)
def test_the_balance_a_too_small_gpu_would_give_is_not_taken(placer: str) -> None:
    # Balanced would be one producer and one consumer per server (objective 0), but only the
    # 80 GiB GPUs hold the producers: the search found that 0 on the 24 GiB GPUs too.
    servers = [ServerSpec("s24", 2, 24 * GIB), ServerSpec("s80", 3, 80 * GIB)]
    models = [
        ModelProfile(f"p{i}", "producer", 1, lendable_bytes=20 * GIB, weights_bytes=30 * GIB)
        for i in range(2)
    ] + [ModelProfile(f"c{i}", "consumer", 1, needed_bytes=20 * GIB) for i in range(2)]
    plan = place(placer, models, servers)
    assert {plan.assignments[p].server for p in ("p0", "p1")} == {"s80"}
    assert plan.objective > 0
