"""Servers of GPUs, one engine per GPU (or per tensor-parallel group), and memory lending.

Engines never share GPU state except through lent memory, and lending here is fixed in advance
(an initial lent capacity per pair, then scheduled reclaims), so each engine's run depends only on
its own requests and its own timeline of memory changes. The cluster therefore simulates engines
one at a time, which is exact and keeps memory and run time linear in the number of engines.

A reclaim at time t lowers what the lender lends to its borrower from C to C': the borrower's KV
held in the reclaimed part moves to host DRAM over PCIe (`PeerStore.set_capacity`, the cost added
to the borrower's next iteration), and the lender's engine gains (C - C') // block bytes KV blocks
(counted over all reclaims so far, so several partial reclaims give back whole blocks of the total).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from serving.costmodel.gpus import get_gpu
from serving.costmodel.model import CostModel, PhaseCoeffs
from serving.costmodel.transfer import nvlink
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.events import KV_GROW, PEER_CAPACITY, EngineStats, TimedChange
from serving.sim.preemption import PeerStore
from serving.workload.request import Request

TP_EFFICIENCY = 0.9


def tp_cost(cost: CostModel, tp: int, efficiency: float = TP_EFFICIENCY) -> CostModel:
    """The cost model of one engine sharded over `tp` GPUs (tensor parallelism), a simple factor.

    The per-token and per-request terms (b, c of both phases) are work split across the GPUs, so
    they shrink by `tp * efficiency` (efficiency < 1 stands for the all-reduces after attention and
    MLP; 0.9 is a round figure for NVLink-connected GPUs at tp <= 8). The fixed term `a` (launches,
    all-reduce latency) stays. KV bytes per token are of the whole model; the engine's capacity in
    blocks is the sum over its GPUs and is set in its EngineConfig.
    """
    if tp < 1:
        raise ValueError(f"{tp=} must be >= 1")
    if not 0 < efficiency <= 1:
        raise ValueError(f"{efficiency=} must be in (0, 1]")
    if tp == 1:
        return cost
    f = 1.0 / (tp * efficiency)

    def scale(p: PhaseCoeffs) -> PhaseCoeffs:
        return PhaseCoeffs(p.a, p.b * f, p.c * f)

    return replace(cost, prefill=scale(cost.prefill), decode=scale(cost.decode), name=f"{cost.name}/tp{tp}")


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the cluster.

    Attributes:
        name: Unique engine name, e.g. "s0/g3".
        server: Name of the server it runs on.
        gpus: GPU indices on that server it occupies (len = tensor-parallel degree).
        model: Model name; requests for it are routed to its engines.
        cost: Single-GPU cost model; scaled by `tp_cost` for len(gpus) > 1.
        config: Engine limits (KV blocks are the engine's total over its GPUs).
        policy: Scheduling-policy name.
        gpu: Name of its GPUs (serving/costmodel/gpus.py), keyword only; a borrower reaches lent
            memory over that GPU's own NVLink (`costmodel.nvlink`: NVLink 3 on an A100).
    """

    name: str
    server: str
    gpus: tuple[int, ...]
    model: str
    cost: CostModel
    config: EngineConfig
    policy: str = "fcfs"
    gpu: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if not self.gpus or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"{self.gpus=} must be distinct GPU indices, at least one")
        get_gpu(self.gpu)  # unknown name: ValueError listing the known ones


@dataclass(frozen=True)
class Lending:
    """Memory a lender engine lends to a borrower on the same server, of the same GPU kind (over
    their NVLink).

    Attributes:
        lender: Lender engine name.
        borrower: Borrower engine name (must use preemption_mode="offload_peer").
        capacity_bytes: Bytes lent at time 0.
        reclaims: (time, new capacity) pairs; each capacity must not exceed the previous one.
    """

    lender: str
    borrower: str
    capacity_bytes: int
    reclaims: tuple[tuple[float, int], ...] = ()

    def __post_init__(self) -> None:
        if self.capacity_bytes < 0:
            raise ValueError(f"{self.capacity_bytes=} must be >= 0")
        prev_t, prev_c = 0.0, self.capacity_bytes
        for t, c in self.reclaims:
            if t < prev_t or c < 0 or c > prev_c:
                raise ValueError(f"reclaim {(t, c)} must come later and lend less than {prev_c} bytes")
            prev_t, prev_c = t, c


@dataclass
class ClusterResult:
    """Per-engine records, counters and final engine state of a cluster run."""

    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    stats: dict[str, EngineStats] = field(default_factory=dict)
    engines: dict[str, EngineSim] = field(default_factory=dict)

    def all_records(self) -> list[RequestRecord]:
        return sorted((r for recs in self.records.values() for r in recs), key=lambda r: r.req_id)


class ClusterSim:
    """Servers with G GPUs each, engines placed on them, and lending pairs."""

    def __init__(
        self, servers: Mapping[str, int], engines: Sequence[EngineSpec], lendings: Sequence[Lending] = ()
    ) -> None:
        names = [e.name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique: {names}")
        used: set[tuple[str, int]] = set()
        for e in engines:
            if e.server not in servers:
                raise ValueError(f"engine {e.name!r}: unknown server {e.server!r}")
            for g in e.gpus:
                if not 0 <= g < servers[e.server]:
                    n = servers[e.server]
                    raise ValueError(f"engine {e.name!r}: GPU {g} not on {e.server!r} ({n} GPUs)")
                if (e.server, g) in used:
                    raise ValueError(f"engine {e.name!r}: GPU {g} of {e.server!r} is already used")
                used.add((e.server, g))
        by_name = {e.name: e for e in engines}
        for ln in lendings:
            lender, borrower = by_name.get(ln.lender), by_name.get(ln.borrower)
            if lender is None or borrower is None:
                raise ValueError(f"lending {ln.lender!r} -> {ln.borrower!r} names an unknown engine")
            if lender is borrower:
                # Its own KV cache is not idle memory: lent to itself, it was counted twice (peer
                # space on top of its cache, and KV blocks it never gave up back on each reclaim).
                raise ValueError(f"engine {ln.lender!r} cannot lend memory to itself")
            if lender.server != borrower.server:
                raise ValueError(f"lending {ln.lender!r} -> {ln.borrower!r} crosses servers (no NVLink)")
            if lender.gpu != borrower.gpu:
                # Aqua lends a peer GPU's memory over the NVLink of one server's GPUs, which are of
                # one kind; the borrower's store is priced at its own GPU's NVLink, so an A100
                # borrowing from an H100 was priced at NVLink 3 and an H100 from an A100 at NVLink 4.
                raise ValueError(
                    f"lending {ln.lender!r} ({lender.gpu}) -> {ln.borrower!r} ({borrower.gpu}) pairs "
                    "different GPU kinds: memory is lent over NVLink between GPUs of one kind"
                )
            if borrower.config.preemption_mode != "offload_peer":
                raise ValueError(f"borrower {ln.borrower!r} needs preemption_mode='offload_peer'")
        borrowers = [ln.borrower for ln in lendings]
        if len(set(borrowers)) != len(borrowers):
            raise ValueError("an engine may borrow from one lender only (one-to-one pairing)")
        self.servers = dict(servers)
        self.engines = list(engines)
        self.lendings = list(lendings)

    def route(self, requests: Sequence[Request]) -> dict[str, list[Request]]:
        """Round-robin in arrival order over the engines serving each model (`slo_class` ignored).

        All requests go to the first model's engines when only one model is deployed; with several,
        use `run(workloads=...)` with one workload per model.
        """
        models = sorted({e.model for e in self.engines})
        if len(models) != 1:
            raise ValueError(f"several models deployed ({models}); pass one workload per model")
        return self._round_robin(self.engines, requests)

    @staticmethod
    def _round_robin(engines: Sequence[EngineSpec], requests: Sequence[Request]) -> dict[str, list[Request]]:
        out: dict[str, list[Request]] = {e.name: [] for e in engines}
        ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
        for i, r in enumerate(ordered):
            out[engines[i % len(engines)].name].append(r)
        return out

    def run(
        self,
        requests: Sequence[Request] | None = None,
        *,
        workloads: Mapping[str, Sequence[Request]] | None = None,
        until: float | None = None,
        progress: Callable[[str, float], None] | None = None,
    ) -> ClusterResult:
        """Simulate every engine; `progress(engine name, simulated time)` is called as each runs.

        Args:
            requests: One workload for the single deployed model (routed round-robin), or
            workloads: model name -> its workload (routed round-robin over that model's engines).
        """
        if (requests is None) == (workloads is None):
            raise ValueError("give either requests or workloads")
        if requests is not None:
            routed = self.route(requests)
        else:
            assert workloads is not None
            routed = {}
            for model, reqs in sorted(workloads.items()):
                engines = [e for e in self.engines if e.model == model]
                if not engines:
                    raise ValueError(f"no engine serves model {model!r}")
                routed.update(self._round_robin(engines, reqs))
        changes: dict[str, list[TimedChange]] = {e.name: [] for e in self.engines}
        peer_capacity = {e.name: e.config.peer_capacity_bytes for e in self.engines}
        by_name = {e.name: e for e in self.engines}
        for k, ln in enumerate(self.lendings):
            peer_capacity[ln.borrower] = ln.capacity_bytes
            lender = by_name[ln.lender]
            block_bytes = lender.config.block_size * lender.cost.kv_bytes_per_token
            # Whole blocks of all that was reclaimed by then, less those already given back: a
            # reclaim of 1.5 blocks gave 1 each time, so lending 3 and reclaiming it in two halves
            # gave the lender 2 blocks back, not 3.
            given = 0
            for t, cap in ln.reclaims:
                changes[ln.borrower].append(TimedChange(t, PEER_CAPACITY, k, cap))
                blocks = (ln.capacity_bytes - cap) // block_bytes
                changes[ln.lender].append(TimedChange(t, KV_GROW, k, blocks - given))
                given = blocks
        result = ClusterResult()
        for spec in self.engines:
            config = spec.config
            if config.preemption_mode == "offload_peer":
                config = replace(config, peer_capacity_bytes=peer_capacity[spec.name])
            # Lent memory is reached over this GPU's own NVLink (NVLink 3 on an A100, 4 on an H100).
            store = (
                PeerStore(config.peer_capacity_bytes, nvlink(spec.gpu))
                if config.preemption_mode == "offload_peer"
                else None
            )
            cost = tp_cost(spec.cost, len(spec.gpus))
            engine = EngineSim(cost, config, get_policy(spec.policy), store=store)
            cb = None
            if progress is not None:
                name = spec.name

                def cb(t: float, name: str = name) -> None:
                    progress(name, t)

            result.records[spec.name] = engine.run(
                routed.get(spec.name, []), changes=changes[spec.name], until=until, progress=cb
            )
            result.stats[spec.name] = engine.stats
            result.engines[spec.name] = engine
        return result
