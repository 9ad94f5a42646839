"""On a server without NVLink pairing lends nothing, so the placer counts a producer there as
lending nothing. It counted the producer's lendable bytes all the same, so it optimised for memory
that is never lent: a producer and a consumer on a server without NVLink balanced to zero there,
and the consumer fell back to host DRAM."""

from __future__ import annotations

import pytest

from serving.placement import ModelProfile, PlacerConfig, Plan, ServerSpec, get_placer
from serving.placement.instance import PlacementInstance

GIB = 1 << 30
MIB_PER_GIB = 1024
PLACERS = ["cp-sat", "greedy"]


def place(placer: str, models: list[ModelProfile], servers: list[ServerSpec]) -> Plan:
    return get_placer(placer, PlacerConfig(time_limit_s=5.0, num_workers=1)).place(models, servers)


def test_a_producer_lends_nothing_on_a_server_without_nvlink() -> None:
    p = ModelProfile("p", "producer", 1, lendable_bytes=40 * GIB)
    assert p.lendable_on(80 * GIB, nvlink=False) == p.balance_on(80 * GIB, nvlink=False) == 0
    assert p.lendable_on(80 * GIB, nvlink=True) == p.balance_on(80 * GIB, nvlink=True) == 40 * GIB
    c = ModelProfile("c", "consumer", 1, needed_bytes=30 * GIB)
    assert c.balance_on(80 * GIB, nvlink=False) == c.balance_on(80 * GIB, nvlink=True) == -30 * GIB


def test_the_instance_weighs_a_producer_by_the_nvlink_of_its_server() -> None:
    servers = [ServerSpec("pcie", 2, 80 * GIB, nvlink=False), ServerSpec("nvl", 2, 80 * GIB)]
    models = [ModelProfile("p", "producer", 1, lendable_bytes=40 * GIB)]
    instance = PlacementInstance.build(models, servers, PlacerConfig())
    assert [instance.weight(0, s) for s in range(2)] == [0, 40 * MIB_PER_GIB]
    assert instance.weights == (40 * MIB_PER_GIB,)  # on the largest GPUs that can lend


def test_the_ilp_pairs_a_producer_and_a_consumer_where_there_is_nvlink() -> None:
    # Counted as lending on the server without NVLink too, p and c balanced to 0 on either server;
    # the hint put them on the first, the one without NVLink, and c fell back to host DRAM.
    servers = [ServerSpec("pcie", 2, 80 * GIB, nvlink=False), ServerSpec("nvl", 2, 80 * GIB)]
    models = [
        ModelProfile("c", "consumer", 1, needed_bytes=40 * GIB),
        ModelProfile("p", "producer", 1, lendable_bytes=40 * GIB),
    ]
    plan = place("cp-sat", models, servers)
    assert {a.server for a in plan.assignments.values()} == {"nvl"}
    assert [(p.lender, p.borrower, p.nbytes) for p in plan.pairings] == [("p", "c", 40 * GIB)]
    assert plan.dram_fallbacks == ()
    assert plan.objective == 0 and plan.status == "optimal"


@pytest.mark.parametrize("placer", PLACERS)
def test_the_objective_and_summaries_count_no_lending_without_nvlink(placer: str) -> None:
    servers = [ServerSpec("pcie", 1, 80 * GIB, nvlink=False)]
    plan = place(placer, [ModelProfile("p", "producer", 1, lendable_bytes=40 * GIB)], servers)
    assert plan.server_summaries[0].memory_balance_bytes == 0
    assert plan.objective == plan.role_weight  # its role imbalance only
