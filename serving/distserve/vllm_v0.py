"""A colocated engine scheduled as vLLM was when DistServe measured it: DistServe's baseline.

DistServe (OSDI'24, Sec. 2.3 and Fig. 1) contrasts disaggregation with vLLM's colocated continuous
batching, in which "prefill-decoding interference" arises: a waiting prompt is run as soon as it can
be, and the running requests' decodes pause behind it. vLLM of that time (v0.2.x; chunked prefill
arrived in v0.4, experimental and off by default) schedules one of two kinds of iteration
(vllm/core/scheduler.py `_schedule`):

  prompt run  whenever a waiting request can be admitted: from the front of the waiting queue, take
              requests while the KV blocks of the whole prompt fit above a watermark of 1% of the
              blocks (BlockSpaceManager `watermark=0.01`), the padded batch len(batch) x max(len) stays
              within `max_num_batched_tokens`, running + batch stays within `max_num_seqs` and the
              padding within `max_paddings` (256). Prompts are never split; the iteration runs the
              batch's prompts only (padded to the longest) and each emits its next token.
  decode run  otherwise: every running request decodes one token. When a token needs a new block
              and none is free, the LAST running request is preempted (recompute: its KV is freed
              and it goes to the FRONT of the waiting queue, to be prefilled again over its prompt
              and the tokens it already generated).
Defaults as in vLLM v0.2.x (vllm/config.py SchedulerConfig, vllm/engine/arg_utils.py EngineArgs):
max_num_batched_tokens = max(max_model_len, 2048) = 4096 for Llama-2's 4096-token context,
max_num_seqs 256, max_paddings 256, block_size 16.

Iteration latencies come from the same CostModel as every other engine here (prefill_time over the
padded prompt lengths, as v0.2's model runner pads a prompt batch to its longest prompt;
decode_time over the context lengths).

Cross-check: on equal-length prompts (so no padding) this engine's token times matched, bit for
bit and through 109 recompute preemptions, those of an independently written V0 step of the
serving/sim EngineSim (another session's work in progress, 2026-11-30).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from serving.costmodel import CostModel, Link
from serving.distserve.parallel import NVLINK3, Parallelism, lane_model
from serving.metrics.records import RequestRecord
from serving.workload.request import Request


@dataclass(frozen=True, slots=True)
class VllmV0Config:
    """Scheduler limits of one vLLM v0.2-style engine.

    Attributes:
        kv_tokens: KV capacity in tokens.
        max_num_batched_tokens: Padded prompt tokens of one prompt run (vLLM v0.2 default for a
            4096-token context: 4096).
        max_num_seqs: Max running requests.
        max_paddings: Max padding tokens in one prompt run.
        block_size: Tokens per KV block.
        watermark: Fraction of blocks a prompt admission must leave free.
    """

    kv_tokens: int
    max_num_batched_tokens: int = 4096
    max_num_seqs: int = 256
    max_paddings: int = 256
    block_size: int = 16
    watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.kv_tokens < self.block_size:
            raise ValueError(f"{self.kv_tokens=} must hold at least one block of {self.block_size=}")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError(f"{self.max_num_batched_tokens=} and {self.max_num_seqs=} must be positive")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"{self.watermark=} must be in [0, 1)")


class VllmV0Sim:
    """One colocated engine: prompt runs first, decode runs otherwise, recompute preemption."""

    def __init__(self, cost: CostModel, config: VllmV0Config) -> None:
        self.cost = cost
        self.config = config
        self.total_blocks = config.kv_tokens // config.block_size
        self.watermark_blocks = int(config.watermark * self.total_blocks)
        self.prompt_runs = 0
        self.decode_runs = 0
        self.preemptions = 0

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def run(self, requests: Sequence[Request]) -> list[RequestRecord]:
        """Serve `requests` to completion; one record per request, in request-id order.

        Raises:
            ValueError: A request whose whole sequence could never fit the KV cache.
        """
        cfg, cost = self.config, self.cost
        ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
        records = [RequestRecord(r.req_id, r.arrival, r.prompt_tokens, r.output_tokens) for r in ordered]
        for rec in records:
            if (
                self._blocks(rec.prompt_tokens + rec.output_tokens)
                > self.total_blocks - self.watermark_blocks
                or rec.prompt_tokens + rec.output_tokens > cfg.max_num_batched_tokens
            ):
                # (a recomputed request is prefilled again over its prompt and outputs)
                raise ValueError(f"request {rec.req_id} can never fit this engine's KV cache or token budget")
        waiting: deque[RequestRecord] = deque()
        running: list[RequestRecord] = []  # admission order; the last is the first victim
        free = self.total_blocks
        held: dict[int, int] = {}  # req_id -> blocks held
        now, nxt, n = 0.0, 0, len(records)
        while nxt < n or waiting or running:
            while nxt < n and records[nxt].arrival <= now:
                waiting.append(records[nxt])
                nxt += 1
            batch: list[RequestRecord] = []
            lens: list[int] = []
            longest = 0
            while waiting:
                r = waiting[0]
                length = r.prompt_tokens + len(r.token_times)  # a recomputed request re-reads its outputs
                need = self._blocks(length)
                padded = (len(batch) + 1) * max(longest, length)
                if (
                    free - need < self.watermark_blocks
                    or padded > cfg.max_num_batched_tokens
                    or len(running) + len(batch) + 1 > cfg.max_num_seqs
                    or padded - sum(lens) - length > cfg.max_paddings
                ):
                    break
                waiting.popleft()
                free -= need
                held[r.req_id] = need
                batch.append(r)
                lens.append(length)
                longest = max(longest, length)
            if batch:
                now += cost.prefill_time([longest] * len(batch))
                self.prompt_runs += 1
                for r in batch:
                    r.token_times.append(now)
                    if len(r.token_times) >= r.output_tokens:
                        free += held.pop(r.req_id)
                    else:
                        running.append(r)
                continue
            if not running:
                if nxt >= n:
                    raise RuntimeError("vLLM v0 engine stalled: a waiting request never fits")
                now = max(now, records[nxt].arrival)
                continue
            free = self._decode(running, waiting, held, free)
            if not running:
                continue
            d = cost.decode
            ctx = sum(r.prompt_tokens for r in running) + sum(len(r.token_times) for r in running)
            now += d.a + d.b * ctx + d.c * len(running)
            self.decode_runs += 1
            still: list[RequestRecord] = []
            for r in running:
                r.token_times.append(now)
                if len(r.token_times) >= r.output_tokens:
                    free += held.pop(r.req_id)
                else:
                    still.append(r)
            running[:] = still
        return sorted(records, key=lambda r: r.req_id)

    def _decode(
        self, running: list[RequestRecord], waiting: deque[RequestRecord], held: dict[int, int], free: int
    ) -> int:
        """Reserve one token slot per running request, preempting from the end; returns free blocks."""
        kept: list[RequestRecord] = []
        queue = deque(running)
        while queue:
            r = queue.popleft()
            # The token decoded now is the sequence's last one (prompt + outputs so far).
            need = self._blocks(r.prompt_tokens + len(r.token_times)) - held[r.req_id]
            while need > free:
                victim = queue.pop() if queue else r
                free += held.pop(victim.req_id)
                waiting.appendleft(victim)
                victim.preemptions += 1
                victim.recomputed_tokens += victim.prompt_tokens + len(victim.token_times)
                self.preemptions += 1
                if victim is r:
                    break
            else:
                free -= need
                held[r.req_id] += need
                kept.append(r)
        running[:] = kept
        return free


def run_colocated_vllm_v0(
    requests: Sequence[Request],
    model: str,
    gpu: str,
    par: Parallelism,
    instances: int,
    max_num_batched_tokens: int = 4096,
    stage_link: Link = NVLINK3,
) -> list[RequestRecord]:
    """Serve `requests` on `instances` colocated vLLM v0.2-style engines, round-robin; records by req_id."""
    lane = lane_model(model, gpu, par, stage_link)
    config = VllmV0Config(lane.kv_tokens_per_lane, max_num_batched_tokens)
    ordered = sorted(requests, key=lambda r: (r.arrival, r.req_id))
    k = lane.lanes * instances
    records: list[RequestRecord] = []
    for j in range(k):
        records.extend(VllmV0Sim(lane.cost, config).run(ordered[j::k]))
    return sorted(records, key=lambda r: r.req_id)
