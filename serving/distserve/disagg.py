"""Prefill/decode disaggregation (DistServe, OSDI'24) in the simulator, and its colocated baseline.

A deployment has `n` prefill instances and `m` decode instances, each with its own parallelism
(serving/distserve/parallel.py: an instance of pp stages is pp lanes). Requests are spread
round-robin in arrival order over all prefill lanes; each prefill lane is an `EngineSim` (FCFS,
vLLM-style batching up to `prefill_max_tokens` per iteration) serving the request's prompt and
emitting its first token, which fixes its TTFT. The request's KV then waits at the prefill instance
until a decode lane pulls it (serving/distserve/decode.py) over `kv_link`; requests are spread over
decode lanes round-robin in the order their prefills finish. Decode load therefore never delays a
prefill (the property disaggregation exists for), and the transfer shows in the gap between the
first and second token.

Colocated serving (the baseline) is `n` ordinary engines of one parallelism running both phases
(FCFS, chunked prefill), requests round-robin (`run_lanes`, which serving/distserve/vllm_v0.py's
vLLM v0.2-style baseline uses too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serving.costmodel import Link
from serving.distserve.decode import DecodeLaneSim, Handoff
from serving.distserve.parallel import NVLINK3, LaneModel, Parallelism, lane_model
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
        kv_link: Link a decode lane pulls KV over (NVLink inside a node, InfiniBand across).
        stage_link: Link between pipeline stages.
        prefill_max_tokens: Token budget of one prefill iteration.
        decode_max_seqs: Max running requests per decode lane.
    """

    model: str
    gpu: str
    prefill: PhaseSpec
    decode: PhaseSpec
    kv_link: Link = NVLINK3
    stage_link: Link = NVLINK3
    prefill_max_tokens: int = 1024
    decode_max_seqs: int = 256

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus


def _round_robin(items: Sequence[Request], k: int) -> list[list[Request]]:
    out: list[list[Request]] = [[] for _ in range(k)]
    for i, r in enumerate(items):
        out[i % k].append(r)
    return out


def run_prefill(
    requests: Sequence[Request], lane: LaneModel, instances: int, max_tokens: int
) -> list[RequestRecord]:
    """Prefill-only run: one record per request with its first token, in request-id order.

    The records keep the requests' full output_tokens (so they are unfinished until decoded).
    """
    ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
    config = EngineConfig(
        max_num_batched_tokens=max_tokens,
        max_num_seqs=256,
        num_kv_blocks=max(1, lane.kv_tokens_per_lane // 16),
    )
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
    """Serve `requests` on a disaggregated deployment; one record per request, by req_id."""
    p_lane = lane_model(dep.model, dep.gpu, dep.prefill.par, dep.stage_link)
    d_lane = lane_model(dep.model, dep.gpu, dep.decode.par, dep.stage_link)
    records = run_prefill(requests, p_lane, dep.prefill.instances, dep.prefill_max_tokens)
    handoffs = [Handoff(rec.token_times[0], rec) for rec in records if rec.token_times]
    run_decode(handoffs, d_lane, dep.decode.instances, dep.kv_link, dep.decode_max_seqs)
    return records


def run_colocated(
    requests: Sequence[Request],
    model: str,
    gpu: str,
    par: Parallelism,
    instances: int,
    max_num_batched_tokens: int = 2048,
    stage_link: Link = NVLINK3,
) -> list[RequestRecord]:
    """Serve `requests` on `instances` colocated FCFS engines (both phases); records by req_id."""
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
