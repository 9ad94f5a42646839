"""Prefill/decode disaggregation (DistServe, OSDI'24) in the simulator, and its colocated baseline.

A deployment has `n` prefill instances and `m` decode instances, each with its own parallelism
(serving/distserve/parallel.py: an instance of pp stages is pp lanes). Requests are spread
round-robin in arrival order over all prefill lanes; each prefill lane
(serving/distserve/prefill.py) is an `EngineSim` (FCFS, vLLM-style batching up to
`prefill_max_tokens` per iteration) serving the request's prompt and emitting its first token. The
request's KV then stays in the prefill lane's KV cache until a decode lane pulls it
(serving/distserve/decode.py) over `kv_link`: transfer is pull-based (DistServe Sec. 4.3), the
prefill instance's memory is the queueing buffer, and a prefill lane whose KV is full of un-pulled
requests admits no new prompt until pulls land. Requests are spread over decode lanes round-robin
in the order their prefills finish (ties by req_id); a decode lane pulls when it has room. So decode
load delays a prefill only when the decode side falls so far behind that un-pulled KV fills a
prefill lane; otherwise TTFT is set by the prefill lanes alone (the property disaggregation exists
for), and the transfer shows in the gap between the first and second token.

The two sides are co-simulated (`co_simulate`): every lane says when its next scheduling point is,
and the earliest acts. At equal times finished prefills are dealt to decode lanes first, then decode
lanes act (their pulls free prefill KV when they land, at t at the earliest), then prefill lanes
(whose iterations end strictly later). A prefill lane frees a request's KV at its first scheduling
point at or after the pull lands. While held KV never stops a prefill lane from scheduling a prompt,
each side runs exactly as it would alone: `run_prefill` and `run_decode` are those phase-isolated
runs (the placement oracle's probes; the prefill run frees KV at the first token, as if pulled at
once).

Colocated serving (the baseline) is `n` ordinary engines of one parallelism running both phases
(FCFS, chunked prefill), requests round-robin (`run_lanes`, which serving/distserve/vllm_v0.py's
vLLM v0.2-style baseline uses too).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from serving.costmodel import Link
from serving.distserve.decode import DecodeLaneSim, Handoff
from serving.distserve.parallel import LaneModel, Parallelism, lane_model, nvlink
from serving.distserve.prefill import PrefillLaneSim
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.workload.request import Request


@dataclass(frozen=True)
class PhaseSpec:
    """Instances of one phase.

    Attributes:
        par: Parallelism of each instance.
        instances: Number of instances.
    """

    par: Parallelism
    instances: int

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"{self.instances=} must be >= 1")

    @property
    def gpus(self) -> int:
        return self.par.gpus * self.instances


@dataclass(frozen=True)
class DisaggDeployment:
    """A disaggregated deployment of one model.

    Attributes:
        model: Cost-model model name, e.g. "llama-2-13b".
        gpu: GPU name, e.g. "a100".
        prefill: Prefill instances.
        decode: Decode instances.
        kv_link: Link a decode lane pulls KV over (NVLink inside a node, InfiniBand across); by
            default the GPU's NVLink (`parallel.nvlink`: 3 on the A100, 4 on the H100/H200).
        stage_link: Link between pipeline stages; by default the GPU's NVLink.
        prefill_max_tokens: Token budget of one prefill iteration.
        decode_max_seqs: Max running requests per decode lane.
    """

    model: str
    gpu: str
    prefill: PhaseSpec
    decode: PhaseSpec
    kv_link: Link | None = None  # None: nvlink(gpu), set by __post_init__
    stage_link: Link | None = None
    prefill_max_tokens: int = 1024
    decode_max_seqs: int = 256

    def __post_init__(self) -> None:
        # The links once defaulted to NVLink 3 whatever the GPU, so an H100 deployment moved KV at
        # the A100's bandwidth while its all-reduces (the presets) used the H100's NVLink 4.
        for name in ("kv_link", "stage_link"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, nvlink(self.gpu))

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus


def _round_robin(items: Sequence[Request], k: int) -> list[list[Request]]:
    out: list[list[Request]] = [[] for _ in range(k)]
    for i, r in enumerate(items):
        out[i % k].append(r)
    return out


def _prefill_config(lane: LaneModel, max_tokens: int) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=max_tokens,
        max_num_seqs=256,
        num_kv_blocks=max(1, lane.kv_tokens_per_lane // 16),
    )


def run_prefill(
    requests: Sequence[Request], lane: LaneModel, instances: int, max_tokens: int
) -> list[RequestRecord]:
    """Prefill-only run: one record per request with its first token, in request-id order.

    Phase-isolated: a request's KV is freed at its first token (as if pulled at once). The records
    keep the requests' full output_tokens (so they are unfinished until decoded).
    """
    ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
    config = _prefill_config(lane, max_tokens)
    records: list[RequestRecord] = []
    for part in _round_robin(ordered, lane.lanes * instances):
        engine = EngineSim(lane.cost, config, get_policy("fcfs"))
        firsts = engine.run([Request(r.req_id, r.arrival, r.prompt_tokens, 1, r.slo_class) for r in part])
        for r, rec in zip(part, firsts, strict=True):
            rec.output_tokens = r.output_tokens
            records.append(rec)
    return sorted(records, key=lambda r: r.req_id)


def run_decode(
    handoffs: Sequence[Handoff], lane: LaneModel, instances: int, link: Link, max_num_seqs: int = 256
) -> None:
    """Decode-only run over `instances` x lanes decode lanes; appends tokens to the records."""
    ordered = sorted(handoffs, key=lambda h: (h.ready, h.record.req_id))
    k = lane.lanes * instances
    for j in range(k):
        DecodeLaneSim(lane.cost, lane.kv_tokens_per_lane, link, max_num_seqs=max_num_seqs).run(ordered[j::k])


def run_disaggregated(requests: Sequence[Request], dep: DisaggDeployment) -> list[RequestRecord]:
    """Serve `requests` on a disaggregated deployment; one record per request, by req_id.

    Raises:
        ValueError: Two requests share a req_id, or a request could never fit a decode lane.
    """
    p_lane = lane_model(dep.model, dep.gpu, dep.prefill.par, dep.stage_link)
    d_lane = lane_model(dep.model, dep.gpu, dep.decode.par, dep.stage_link)
    kv_link = dep.kv_link or nvlink(dep.gpu)  # (never None after __post_init__)
    ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
    config = _prefill_config(p_lane, dep.prefill_max_tokens)
    prefills = [
        PrefillLaneSim(p_lane.cost, config, part)
        for part in _round_robin(ordered, p_lane.lanes * dep.prefill.instances)
    ]
    decodes = [
        DecodeLaneSim(d_lane.cost, d_lane.kv_tokens_per_lane, kv_link, max_num_seqs=dep.decode_max_seqs)
        for _ in range(d_lane.lanes * dep.decode.instances)
    ]
    co_simulate(prefills, decodes)
    return sorted((rec for p in prefills for rec in p.records), key=lambda r: r.req_id)


def co_simulate(prefills: Sequence[PrefillLaneSim], decodes: Sequence[DecodeLaneSim]) -> None:
    """Run prefill and decode lanes together, in time order, until every request is decoded.

    Sets every decode lane's `on_pull` so that a pull frees the request's KV at its prefill lane
    when it lands. Finished prefills are dealt round-robin over `decodes` in (ready, req_id) order.

    Raises:
        ValueError: No decode lane, two requests share a req_id, or a request could never fit a
            decode lane.
        RuntimeError: The lanes stall with requests left (a simulator bug).
    """
    if not decodes:
        raise ValueError("co_simulate needs at least one decode lane")
    owner: dict[int, int] = {}  # req_id -> index of the prefill lane holding its KV
    for k, p in enumerate(prefills):
        for rec in p.records:
            if rec.req_id in owner:
                raise ValueError(f"req_id {rec.req_id} appears twice")
            owner[rec.req_id] = k
    nd = len(decodes)
    lanes: list[PrefillLaneSim | DecodeLaneSim] = [*decodes, *prefills]  # decode first at equal times
    times = [lane.next_time() for lane in lanes]  # lane index -> its next scheduling point

    def on_pull(rec: RequestRecord, landed: float) -> None:
        k = owner[rec.req_id]
        prefills[k].release(rec.req_id, landed)
        times[nd + k] = prefills[k].next_time()

    for d in decodes:
        d.on_pull = on_pull
    # Heap of prefilled requests not yet dealt to a decode lane: (ready, req_id, record).
    ready: list[tuple[float, int, RequestRecord]] = []
    dealt = 0
    inf = float("inf")
    while True:
        i = min(range(len(lanes)), key=times.__getitem__)
        t = times[i]
        if ready and ready[0][0] <= t:  # deal every request ready by then, in (ready, req_id) order
            t = ready[0][0]
            while ready and ready[0][0] <= t:
                _, _, rec = heapq.heappop(ready)
                j = dealt % nd
                decodes[j].offer(Handoff(t, rec))
                times[j] = decodes[j].next_time()
                dealt += 1
            continue
        if t == inf:
            break
        lane = lanes[i]
        if isinstance(lane, DecodeLaneSim):
            lane.step()
        else:
            for rec in lane.step():
                heapq.heappush(ready, (rec.token_times[0], rec.req_id, rec))
        times[i] = lane.next_time()
    if any(lane.pending for lane in lanes):
        raise RuntimeError("disaggregated run stalled: requests left but no lane can act")
    for d in decodes:
        d.finish()


def run_colocated(
    requests: Sequence[Request],
    model: str,
    gpu: str,
    par: Parallelism,
    instances: int,
    max_num_batched_tokens: int = 2048,
    stage_link: Link | None = None,
) -> list[RequestRecord]:
    """Serve `requests` on `instances` colocated FCFS engines (both phases); records by req_id.

    `stage_link` joins pipeline stages; by default the GPU's NVLink (`parallel.nvlink`).
    """
    lane = lane_model(model, gpu, par, stage_link)
    config = EngineConfig(
        max_num_batched_tokens=max_num_batched_tokens, num_kv_blocks=max(1, lane.kv_tokens_per_lane // 16)
    )
    return run_lanes(requests, lane, instances, config)


def run_lanes(
    requests: Sequence[Request], lane: LaneModel, instances: int, config: EngineConfig
) -> list[RequestRecord]:
    """Serve `requests` round-robin (in arrival order) on `instances` x lanes FCFS engines of `config`.

    Returns:
        One record per request, in request-id order.
    """
    ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
    records: list[RequestRecord] = []
    for part in _round_robin(ordered, lane.lanes * instances):
        records.extend(EngineSim(lane.cost, config, get_policy("fcfs")).run(part))
    return sorted(records, key=lambda r: r.req_id)
