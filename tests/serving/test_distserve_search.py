"""DistServe's placement searches against brute force over random per-instance goodput tables.

The tables hold small integers so that ties (equal per-GPU goodput, equal rate, equal GPUs) are
common: the searches must return a placement with the best score (per-GPU goodput, then goodput,
then fewer GPUs), and pruning must not change the answer when goodputs are found by probing.
"""

from __future__ import annotations

import functools
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.costmodel import Link
from serving.distserve import (
    Bisection,
    Parallelism,
    PhaseOracle,
    PhaseSpec,
    high_affinity_search,
    low_affinity_search,
)
from serving.distserve.parallel import feasible

MODEL, GPU = "llama-2-13b", "a100"
PARS = [
    Parallelism(tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 4) if feasible(MODEL, GPU, Parallelism(tp, pp))
]


class RandomTableOracle(PhaseOracle):
    """Per-instance goodputs from tables (by (tp, pp)), known exactly or found by probing."""

    def __init__(
        self,
        table_p: dict[Parallelism, int],
        table_d: dict[Parallelism, int],
        probed: bool,
        model: str = MODEL,
    ) -> None:
        super().__init__(model, GPU, lambda rate: [], 0.4, 0.04, rel_tol=0.05)
        self.table_p, self.table_d, self.probed = table_p, table_d, probed
        self.made: dict[tuple[str, Parallelism], Bisection] = {}

    def _bracket(self, phase: str, par: Parallelism, value: float) -> Bisection:
        if (phase, par) not in self.made:
            if self.probed:
                self.made[phase, par] = Bisection(lambda r: r <= value, value / 3, value * 1.7, self.rel_tol)
            else:
                self.made[phase, par] = Bisection.exact(value)
        return self.made[phase, par]

    def prefill_bracket(self, par: Parallelism, stage_link: Link) -> Bisection:
        return self._bracket("p", par, self.table_p[par])

    def decode_bracket(self, par: Parallelism, stage_link: Link, kv_link: Link) -> Bisection:
        return self._bracket("d", par, self.table_d[par])


def brute_force(
    table_p: dict[Parallelism, int], table_d: dict[Parallelism, int], kind: str, nodes: int, per_node: int
) -> tuple[float, float, int]:
    """The best (per-GPU goodput, goodput, -GPUs) over every placement the search may consider."""
    best = (0.0, 0.0, 0)
    for p, d in itertools.product(PARS, PARS):
        if kind == "high":
            if p.gpus > per_node or d.gpus > per_node:
                continue
            counts = itertools.product(range(1, nodes * per_node + 1), repeat=2)
            placements = [(n_p, n_d, n_p * p.gpus + n_d * d.gpus) for n_p, n_d in counts]
            placements = [x for x in placements if x[2] <= nodes * per_node]
        else:
            if p.pp != d.pp or p.pp > nodes:
                continue
            counts = itertools.product(range(1, per_node + 1), repeat=2)
            placements = [(n_p, n_d, p.pp * (n_p * p.tp + n_d * d.tp)) for n_p, n_d in counts]
            placements = [x for x in placements if x[2] <= p.pp * per_node]
        for n_p, n_d, gpus in placements:
            rate = min(n_p * table_p[p], n_d * table_d[d])
            best = max(best, (rate / gpus, rate, -gpus))
    return best


tables = st.fixed_dictionaries({par: st.integers(1, 12) for par in PARS})


@settings(max_examples=40, deadline=None)
@given(
    table_p=tables,
    table_d=tables,
    kind=st.sampled_from(["high", "low"]),
    shape=st.sampled_from([(1, 2), (1, 4), (2, 2), (2, 4)]),
)
def test_the_searches_return_the_brute_force_best_and_pruning_changes_nothing(
    table_p: dict[Parallelism, int], table_d: dict[Parallelism, int], kind: str, shape: tuple[int, int]
) -> None:
    nodes, per_node = shape
    search = high_affinity_search if kind == "high" else low_affinity_search
    got = search(RandomTableOracle(table_p, table_d, probed=False), nodes, per_node, max_pp=4)
    rate = min(
        got.prefill.instances * table_p[got.prefill.par], got.decode.instances * table_d[got.decode.par]
    )
    unit = got.gpus // got.units
    assert (rate / unit, rate, -unit) == brute_force(table_p, table_d, kind, nodes, per_node)
    assert got.per_gpu_goodput == rate / unit
    assert got.units == (nodes * per_node // unit if kind == "high" else nodes // got.prefill.par.pp)
    # Goodputs found by bisection: the pruned search answers what the exhaustive one does.
    full = search(RandomTableOracle(table_p, table_d, probed=True), nodes, per_node, max_pp=4, prune=False)
    pruned = search(RandomTableOracle(table_p, table_d, probed=True), nodes, per_node, max_pp=4)
    assert pruned == full


def test_low_affinity_search_considers_segments_that_fit_only_when_pipelined() -> None:
    # Regression: the segment widths were the tp degrees whose instance fits a node with pp = 1,
    # so a model that fits only when pipelined had those segments left out. llama-3-70b on A100s
    # fits tp 1 only at pp >= 4 and tp 2 only at pp >= 2: on 2-GPU nodes no tp fits unpipelined
    # and the search said the model did not fit the cluster at all.
    model = "llama-3-70b"
    pars = [Parallelism(tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 4)]
    table = {par: 10 for par in pars if feasible(model, GPU, par)}
    assert Parallelism(1, 4) in table and Parallelism(2, 1) not in table
    got = low_affinity_search(RandomTableOracle(table, table, probed=False, model=model), 4, 2)
    assert (got.prefill, got.decode, got.units) == (
        PhaseSpec(Parallelism(1, 4), 1),
        PhaseSpec(Parallelism(1, 4), 1),
        1,
    )
    # On 4-GPU nodes only tp 2 x pp 2 segments let a prefill and a decode segment share a node (two
    # tp 4 segments need 8 GPUs): one unit of 2 x (2 + 2) GPUs.
    got = low_affinity_search(RandomTableOracle(table, table, probed=False, model=model), 2, 4)
    assert got.per_gpu_goodput == 10 / 8


def test_it_never_places_a_tensor_parallel_degree_that_does_not_divide_the_heads() -> None:
    # llama-2-13b has 40 heads: on 16-GPU nodes tp=16 was feasible and enumerated.
    assert not feasible(MODEL, GPU, Parallelism(16, 1))
    pars = [Parallelism(tp, pp) for tp in (1, 2, 4, 8, 16) for pp in (1, 2, 4)]
    table = {p: 100 * p.tp for p in pars}  # goodput grows with tp: tp=16 would win if offered
    for search in (high_affinity_search, low_affinity_search):
        placed = search(RandomTableOracle(table, table, probed=False), 2, 16)
        assert placed.prefill.par.tp <= 8 and placed.decode.par.tp <= 8


def _packs(widths: list[int], nodes: int, per_node: int) -> bool:
    """Whether instances of these GPU widths fit `nodes` nodes, each inside one node (exhaustive)."""
    order = sorted(widths, reverse=True)

    @functools.cache
    def place(i: int, free: tuple[int, ...]) -> bool:
        if i == len(order):
            return True
        for f in set(free):
            if f >= order[i]:
                rest = list(free)
                rest.remove(f)
                if place(i + 1, tuple(sorted([*rest, f - order[i]]))):
                    return True
        return False

    return place(0, (per_node,) * nodes)


@settings(max_examples=30, deadline=None)
@given(table_p=tables, table_d=tables, shape=st.sampled_from([(3, 6), (2, 6), (3, 5), (2, 3)]))
def test_high_affinity_placements_pack_into_the_nodes(
    table_p: dict[Parallelism, int], table_d: dict[Parallelism, int], shape: tuple[int, int]
) -> None:
    # Every instance sits inside one node. On 3 nodes of 6 GPUs the search used to place four 4-GPU
    # prefill instances and two 1-GPU decode ones (18 GPUs, but one 4-GPU instance per node).
    nodes, per_node = shape
    got = high_affinity_search(RandomTableOracle(table_p, table_d, probed=False), nodes, per_node, max_pp=4)
    p, d = got.prefill, got.decode
    widths = [p.par.gpus] * (p.instances * got.units) + [d.par.gpus] * (d.instances * got.units)
    assert _packs(widths, nodes, per_node)
    assert not _packs(widths + [p.par.gpus] * p.instances + [d.par.gpus] * d.instances, nodes, per_node)


def test_it_does_not_place_more_instances_than_the_nodes_hold() -> None:
    table_p = {par: (1000 if par == Parallelism(4, 1) else 1) for par in PARS}
    table_d = {par: (2000 if par == Parallelism(1, 1) else 1) for par in PARS}
    got = high_affinity_search(RandomTableOracle(table_p, table_d, probed=False), 3, 6)
    assert got.prefill.par == Parallelism(4, 1) and got.decode.par == Parallelism(1, 1)
    assert got.prefill.instances * got.units <= 3  # one 4-GPU instance per 6-GPU node
