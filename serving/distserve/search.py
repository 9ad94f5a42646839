"""DistServe's placement searches (OSDI'24, Sec. 4, Algorithms 1 and 2) with the simulator as oracle.

Both searches score a placement by its per-GPU goodput: the highest request rate per GPU at which
at least `target` of the requests meet their SLO. As in the paper, each phase is simulated on its
own to find the goodput of one instance of a given parallelism (`PhaseOracle`):
  prefill goodput  g_p(tp, pp): highest rate at which >= target of requests get TTFT <= ttft_s;
  decode goodput   g_d(tp, pp): highest rate at which >= target of requests get TPOT <= tpot_s,
                   requests arriving with their KV ready and pulled over the placement's KV link.
A placement with n_p prefill and n_d decode instances then sustains min(n_p g_p, n_d g_d). The
lanes of a pipelined instance are identical and get equal shares of its requests, so one lane is
simulated and its goodput multiplied by pp. Each goodput search is bracketed by the lane's capacity
bound (prefill: 1 / prefill time of a mean prompt; decode: the largest batch whose step fits the
TPOT, over TPOT x mean output), then bisected to `rel_tol`.

High node-affinity (Algorithm 1): the cluster's network is fast enough to move KV between any two
    GPUs (InfiniBand), so the prefill and decode parallelism are chosen independently: every
    feasible (tp, pp) with tp x pp <= GPUs per node, every instance count that fits the cluster.
Low node-affinity (Algorithm 2): KV may only cross NVLink, so the prefill and decode instances
    share the pipeline depth pp and the stage-k segments of both sit in one node: a node holds
    n_p prefill segments of tp_p GPUs and n_d decode segments of tp_d GPUs with
    n_p tp_p + n_d tp_d <= GPUs per node, pipeline stages cross nodes (over InfiniBand), KV moves
    over NVLink. A unit spans pp nodes; the cluster holds nodes // pp units.
Ties are broken towards more total goodput, then fewer GPUs, then the smaller configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from serving.costmodel import Link
from serving.distserve.decode import Handoff
from serving.distserve.disagg import PhaseSpec, run_decode, run_prefill
from serving.distserve.parallel import IB_HDR, NVLINK3, LaneModel, Parallelism, feasible, lane_model
from serving.metrics import goodput
from serving.metrics.latency import tpot
from serving.metrics.records import RequestRecord
from serving.workload.request import Request

Workload = Callable[[float], list[Request]]  # rate (req/s) -> requests


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


@dataclass
class PhaseOracle:
    """Simulated goodput of one instance of each phase, memoised by (phase, parallelism, link).

    Attributes:
        model, gpu: Cost-model preset names.
        workload: rate -> requests (seeded, so repeated probes agree); a fixed number of requests
            per probe keeps every probe equally cheap.
        ttft_s, tpot_s: The SLO.
        target: Fraction of requests that must meet it.
        rel_tol: Relative precision of each goodput search.
        prefill_max_tokens: Token budget of one prefill iteration.
    """

    model: str
    gpu: str
    workload: Workload
    ttft_s: float
    tpot_s: float
    target: float = 0.9
    rel_tol: float = 0.03
    prefill_max_tokens: int = 1024
    simulations: int = 0
    _cache: dict[tuple[str, int, int, str], float] = field(default_factory=dict)

    def prefill(self, par: Parallelism, stage_link: Link) -> float:
        key = ("prefill", par.tp, par.pp, stage_link.name if par.pp > 1 else "-")
        if key not in self._cache:
            lane = lane_model(self.model, self.gpu, par, stage_link)

            one = LaneModel(lane.cost, 1, lane.kv_tokens_per_lane)

            def att(rate: float) -> float:
                self.simulations += 1
                recs = run_prefill(self.workload(rate), one, 1, self.prefill_max_tokens)
                ok = sum(1 for r in recs if r.token_times and r.token_times[0] - r.arrival <= self.ttft_s)
                return ok / len(recs) if recs else 1.0

            # Bracket from the capacity bound: lanes / prefill time of a mean prompt.
            hi = 1.2 / lane.cost.prefill_time([round(self._mean_lengths()[0])])
            self._cache[key] = lane.lanes * goodput(att, self.target, lo=hi / 4, hi=hi, rel_tol=self.rel_tol)
        return self._cache[key]

    def _mean_lengths(self) -> tuple[float, float]:
        reqs = self.workload(1.0)
        return (
            sum(r.prompt_tokens for r in reqs) / len(reqs),
            sum(r.output_tokens for r in reqs) / len(reqs),
        )

    def decode(self, par: Parallelism, stage_link: Link, kv_link: Link) -> float:
        key = ("decode", par.tp, par.pp, f"{stage_link.name if par.pp > 1 else '-'}/{kv_link.name}")
        if key not in self._cache:
            lane = lane_model(self.model, self.gpu, par, stage_link)

            one = LaneModel(lane.cost, 1, lane.kv_tokens_per_lane)

            def att(rate: float) -> float:
                self.simulations += 1
                reqs = self.workload(rate)
                recs = [
                    RequestRecord(r.req_id, r.arrival, r.prompt_tokens, r.output_tokens, [r.arrival])
                    for r in reqs
                ]
                run_decode([Handoff(r.arrival, r) for r in recs], one, 1, kv_link)
                ok = sum(1 for r in recs if (tpot(r) or 0.0) <= self.tpot_s)
                return ok / len(recs) if recs else 1.0

            # Bracket from the capacity bound: the largest batch whose decode step fits the TPOT.
            prompt, output = self._mean_lengths()
            batch = 1
            while lane.cost.decode_time([round(prompt + output / 2)] * (batch + 1)) <= self.tpot_s:
                batch += 1
            hi = 1.2 * batch / (self.tpot_s * output)
            self._cache[key] = lane.lanes * goodput(att, self.target, lo=hi / 4, hi=hi, rel_tol=self.rel_tol)
        return self._cache[key]


def _parallelisms(model: str, gpu: str, max_tp: int, max_pp: int, max_gpus: int) -> list[Parallelism]:
    out = []
    tp = 1
    while tp <= max_tp:
        for pp in range(1, max_pp + 1):
            par = Parallelism(tp, pp)
            if par.gpus <= max_gpus and feasible(model, gpu, par):
                out.append(par)
        tp *= 2
    return out


def _better(a: tuple[float, float, int], b: tuple[float, float, int] | None) -> bool:
    # (per-GPU goodput, total goodput, -GPUs): larger is better; exact ties keep the earlier one.
    return b is None or a > b


def high_affinity_search(
    oracle: PhaseOracle, nodes: int, gpus_per_node: int, max_pp: int = 4, kv_link: Link = IB_HDR
) -> Placement:
    """Algorithm 1: prefill and decode parallelism and instance counts chosen independently."""
    total = nodes * gpus_per_node
    pars = _parallelisms(oracle.model, oracle.gpu, gpus_per_node, max_pp, gpus_per_node)
    gp = {p: oracle.prefill(p, NVLINK3) for p in pars}
    gd = {p: oracle.decode(p, NVLINK3, kv_link) for p in pars}
    best: tuple[float, float, int] | None = None
    choice: tuple[PhaseSpec, PhaseSpec] | None = None
    for pp_par in pars:
        for dp_par in pars:
            for n_p in range(1, total // pp_par.gpus + 1):
                left = total - n_p * pp_par.gpus
                for n_d in range(1, left // dp_par.gpus + 1):
                    gpus = n_p * pp_par.gpus + n_d * dp_par.gpus
                    rate = min(n_p * gp[pp_par], n_d * gd[dp_par])
                    score = (rate / gpus, rate, -gpus)
                    if _better(score, best):
                        best, choice = score, (PhaseSpec(pp_par, n_p), PhaseSpec(dp_par, n_d))
    if best is None or choice is None:
        raise ValueError("no feasible placement: the model does not fit the cluster")
    unit_gpus = choice[0].gpus + choice[1].gpus
    return Placement("high", choice[0], choice[1], total // unit_gpus, best[0], kv_link, NVLINK3)


def low_affinity_search(
    oracle: PhaseOracle, nodes: int, gpus_per_node: int, max_pp: int = 4, stage_link: Link = IB_HDR
) -> Placement:
    """Algorithm 2: shared pipeline depth; stage segments of both phases share a node (NVLink KV)."""
    best: tuple[float, float, int] | None = None
    choice: tuple[PhaseSpec, PhaseSpec] | None = None
    for pp in range(1, min(max_pp, nodes) + 1):
        pars = _parallelisms(oracle.model, oracle.gpu, gpus_per_node, 1, gpus_per_node)
        segs = [
            Parallelism(p.tp, pp) for p in pars if feasible(oracle.model, oracle.gpu, Parallelism(p.tp, pp))
        ]
        gp = {p: oracle.prefill(p, stage_link) for p in segs}
        gd = {p: oracle.decode(p, stage_link, NVLINK3) for p in segs}
        for ps in segs:
            for ds in segs:
                for n_p in range(1, gpus_per_node // ps.tp + 1):
                    for n_d in range(1, (gpus_per_node - n_p * ps.tp) // ds.tp + 1):
                        gpus = pp * (n_p * ps.tp + n_d * ds.tp)
                        rate = min(n_p * gp[ps], n_d * gd[ds])
                        score = (rate / gpus, rate, -gpus)
                        if _better(score, best):
                            best, choice = score, (PhaseSpec(ps, n_p), PhaseSpec(ds, n_d))
    if best is None or choice is None:
        raise ValueError("no feasible placement: the model does not fit the cluster")
    units = nodes // choice[0].par.pp
    return Placement("low", choice[0], choice[1], units, best[0], NVLINK3, stage_link)
