"""DistServe's placement searches (OSDI'24, Sec. 4, Algorithms 1 and 2) with the simulator as oracle.

Both searches score a placement by its per-GPU goodput: the highest request rate per GPU at which
at least `target` of the requests meet their SLO. A placement with n_p prefill and n_d decode
instances sustains min(n_p g_p, n_d g_d), from the per-instance phase goodputs g_p and g_d that
`PhaseOracle` simulates (serving/distserve/oracle.py).

High node-affinity (Algorithm 1): the cluster's network is fast enough to move KV between any two
    GPUs (InfiniBand), so the prefill and decode parallelism are chosen independently: every
    feasible (tp, pp) with tp x pp <= GPUs per node, every instance count that fits the cluster.
    An instance sits inside one node (its stages talk over NVLink), so "fits" means the instances
    pack into the nodes, not only that their GPUs add up to at most the cluster's: three 4-GPU
    instances do not fit two 6-GPU nodes (`_max_decodes`). With node sizes and instance widths
    that are powers of two (8-GPU nodes) the two agree.
Low node-affinity (Algorithm 2): KV may only cross NVLink, so the prefill and decode instances
    share the pipeline depth pp and the stage-k segments of both sit in one node: a node holds
    n_p prefill segments of tp_p GPUs and n_d decode segments of tp_d GPUs with
    n_p tp_p + n_d tp_d <= GPUs per node, pipeline stages cross nodes (over InfiniBand), KV moves
    over NVLink. A unit spans pp nodes; the cluster holds nodes // pp units.
Ties are broken towards more total goodput, then fewer GPUs, then the earlier configuration in the
enumeration order (prefill parallelism, decode parallelism, n_p, n_d).

Branch and bound: every candidate placement is enumerated (cheap arithmetic), but a phase goodput is
simulated only as far as needed. Each phase's goodput search is a bracket [lower, upper] that holds
its final value; a placement's per-GPU goodput then lies between the same formula over the lower
and over the upper bounds. Placements whose upper bound is below the best lower bound cannot win
and are dropped; the bracket of the most promising remaining placement is bisected one probe at a
time, until every remaining placement is scored by fully refined goodputs. The answer is the one
the exhaustive search (`prune=False`: refine every bracket, then enumerate) gives: a dropped
placement's true score is strictly below the winner's, and the remaining ones are compared by the
same exact values, tie-break and enumeration order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.costmodel import Link
from serving.distserve.disagg import PhaseSpec
from serving.distserve.oracle import Bisection, PhaseOracle
from serving.distserve.parallel import IB_HDR, Parallelism, feasible, nvlink


@dataclass(frozen=True)
class Placement:
    """The result of a search.

    Attributes:
        kind: "high" or "low" node-affinity.
        prefill: Prefill instances of one unit.
        decode: Decode instances of one unit.
        units: Copies of the unit placed in the cluster.
        per_gpu_goodput: Estimated goodput per GPU (req/s/GPU) from the phase oracles.
        kv_link: Link KV moves over.
        stage_link: Link between pipeline stages.
    """

    kind: str
    prefill: PhaseSpec
    decode: PhaseSpec
    units: int
    per_gpu_goodput: float
    kv_link: Link
    stage_link: Link

    @property
    def gpus(self) -> int:
        return self.units * (self.prefill.gpus + self.decode.gpus)


def _tp_degrees(max_tp: int) -> list[int]:
    """Tensor-parallel degrees tried: the powers of two up to `max_tp`."""
    out = [1]
    while out[-1] * 2 <= max_tp:
        out.append(out[-1] * 2)
    return out


def _parallelisms(model: str, gpu: str, max_tp: int, max_pp: int, max_gpus: int) -> list[Parallelism]:
    out = []
    for tp in _tp_degrees(max_tp):
        for pp in range(1, max_pp + 1):
            par = Parallelism(tp, pp)
            if par.gpus <= max_gpus and feasible(model, gpu, par):
                out.append(par)
    return out


def _max_decodes(p_width: int, d_width: int, nodes: int, per_node: int) -> list[int]:
    """out[n_p]: most instances of `d_width` GPUs that fit beside n_p of `p_width` GPUs when every
    instance must sit inside one of `nodes` nodes of `per_node` GPUs; -1 where n_p do not fit.

    A max-plus convolution over the nodes of one node's options (i prefill instances leave room
    for (per_node - i p_width) // d_width decode instances); fewer decodes always fit too.
    """
    per = [(per_node - i * p_width) // d_width for i in range(per_node // p_width + 1)]
    best = [0]  # best[n_p] over the nodes placed so far
    for _ in range(nodes):
        nxt = [-1] * (len(best) + len(per) - 1)
        for n, have in enumerate(best):
            if have < 0:
                continue
            for i, room in enumerate(per):
                nxt[n + i] = max(nxt[n + i], have + room)
        best = nxt
    return best


@dataclass
class _Options:
    """Candidate placements in enumeration order, as parallel arrays, with their phase brackets."""

    brackets: list[Bisection]  # distinct phase brackets, by index
    specs: list[tuple[PhaseSpec, PhaseSpec]]  # option -> (prefill, decode)
    p_idx: list[int]  # option -> index of its prefill bracket
    d_idx: list[int]  # option -> index of its decode bracket
    n_p: list[int]
    n_d: list[int]
    gpus: list[int]  # GPUs the score divides by

    def add(self, p: Bisection, d: Bisection, ps: PhaseSpec, ds: PhaseSpec, gpus: int) -> None:
        ids = {id(b): i for i, b in enumerate(self.brackets)}
        for b in (p, d):
            if id(b) not in ids:
                ids[id(b)] = len(self.brackets)
                self.brackets.append(b)
        self.specs.append((ps, ds))
        self.p_idx.append(ids[id(p)])
        self.d_idx.append(ids[id(d)])
        self.n_p.append(ps.instances)
        self.n_d.append(ds.instances)
        self.gpus.append(gpus)


def _new_options() -> _Options:
    return _Options([], [], [], [], [], [], [])


def _choose(opts: _Options, prune: bool) -> tuple[tuple[PhaseSpec, PhaseSpec], float]:
    """The best option and its per-GPU goodput (see the module docstring for the pruning)."""
    if not opts.specs:
        raise ValueError("no feasible placement: the model does not fit the cluster")
    if not prune:
        for b in opts.brackets:
            b.value()
    pi, di = np.array(opts.p_idx), np.array(opts.d_idx)
    n_p, n_d, gpus = np.array(opts.n_p), np.array(opts.n_d), np.array(opts.gpus, dtype=float)
    alive = np.arange(len(opts.specs))
    while True:
        lo = np.array([b.lower for b in opts.brackets])
        hi = np.array([b.upper for b in opts.brackets])
        a_pi, a_di, a_np, a_nd, a_g = pi[alive], di[alive], n_p[alive], n_d[alive], gpus[alive]
        lower = np.minimum(a_np * lo[a_pi], a_nd * lo[a_di]) / a_g
        upper = np.minimum(a_np * hi[a_pi], a_nd * hi[a_di]) / a_g
        keep = upper >= lower.max()  # a dropped option's score is < the best option's
        alive, upper = alive[keep], upper[keep]
        done = np.array([b.done for b in opts.brackets])
        open_ = ~(done[pi[alive]] & done[di[alive]])
        if not open_.any():
            break
        top = alive[open_][np.argmax(upper[open_])]  # the most promising unsettled option
        for b in (opts.brackets[pi[top]], opts.brackets[di[top]]):
            b.step()
    best: tuple[float, float, int] | None = None
    choice = opts.specs[int(alive[0])]
    for k in alive.tolist():  # enumeration order: exact ties keep the earlier option
        rate = min(
            opts.n_p[k] * opts.brackets[opts.p_idx[k]].value(),
            opts.n_d[k] * opts.brackets[opts.d_idx[k]].value(),
        )
        score = (rate / opts.gpus[k], rate, -opts.gpus[k])
        if best is None or score > best:
            best, choice = score, opts.specs[k]
    assert best is not None
    return choice, best[0]


def high_affinity_search(
    oracle: PhaseOracle,
    nodes: int,
    gpus_per_node: int,
    max_pp: int = 4,
    kv_link: Link = IB_HDR,
    prune: bool = True,
) -> Placement:
    """Algorithm 1: prefill and decode parallelism and instance counts chosen independently.

    `prune=False` simulates every phase goodput to the end (the exhaustive search); the answer is
    the same either way.
    """
    pars = _parallelisms(oracle.model, oracle.gpu, gpus_per_node, max_pp, gpus_per_node)
    node_link = nvlink(oracle.gpu)
    opts = _new_options()
    for pp_par in pars:
        gp = oracle.prefill_bracket(pp_par, node_link)
        for dp_par in pars:
            gd = oracle.decode_bracket(dp_par, node_link, kv_link)
            max_d = _max_decodes(pp_par.gpus, dp_par.gpus, nodes, gpus_per_node)
            for n_p in range(1, len(max_d)):
                for n_d in range(1, max_d[n_p] + 1):
                    gpus = n_p * pp_par.gpus + n_d * dp_par.gpus
                    opts.add(gp, gd, PhaseSpec(pp_par, n_p), PhaseSpec(dp_par, n_d), gpus)
    (ps, ds), per_gpu = _choose(opts, prune)
    # Copies of the unit: as many as pack into the nodes (total // unit GPUs where widths divide).
    max_d = _max_decodes(ps.par.gpus, ds.par.gpus, nodes, gpus_per_node)
    units = 1
    while (units + 1) * ps.instances < len(max_d) and max_d[(units + 1) * ps.instances] >= (
        units + 1
    ) * ds.instances:
        units += 1
    return Placement("high", ps, ds, units, per_gpu, kv_link, node_link)


def low_affinity_search(
    oracle: PhaseOracle,
    nodes: int,
    gpus_per_node: int,
    max_pp: int = 4,
    stage_link: Link = IB_HDR,
    prune: bool = True,
) -> Placement:
    """Algorithm 2: shared pipeline depth; stage segments of both phases share a node (NVLink KV).

    `prune=False` simulates every phase goodput to the end (the exhaustive search); the answer is
    the same either way.
    """
    node_link = nvlink(oracle.gpu)
    opts = _new_options()
    for pp in range(1, min(max_pp, nodes) + 1):
        # Every segment width whose pipelined instance fits, not only those that fit unpipelined:
        # a model too big for tp GPUs may fit tp x pp of them.
        segs = [
            Parallelism(tp, pp)
            for tp in _tp_degrees(gpus_per_node)
            if feasible(oracle.model, oracle.gpu, Parallelism(tp, pp))
        ]
        for ps in segs:
            gp = oracle.prefill_bracket(ps, stage_link)
            for ds in segs:
                gd = oracle.decode_bracket(ds, stage_link, node_link)
                for n_p in range(1, gpus_per_node // ps.tp + 1):
                    for n_d in range(1, (gpus_per_node - n_p * ps.tp) // ds.tp + 1):
                        gpus = pp * (n_p * ps.tp + n_d * ds.tp)
                        opts.add(gp, gd, PhaseSpec(ps, n_p), PhaseSpec(ds, n_d), gpus)
    (p_spec, d_spec), per_gpu = _choose(opts, prune)
    return Placement("low", p_spec, d_spec, nodes // p_spec.par.pp, per_gpu, node_link, stage_link)
