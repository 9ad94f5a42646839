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
              and it goes back to the front of the waiting queue, to be prefilled again over its
              prompt and the tokens it already generated).
Defaults as in vLLM v0.2.x (vllm/config.py SchedulerConfig, vllm/engine/arg_utils.py EngineArgs):
max_num_batched_tokens = max(max_model_len, 2048) = 4096 for Llama-2's 4096-token context,
max_num_seqs 256, max_paddings 256, block_size 16.

That scheduler is serving/sim's V0 step (serving/sim/v0.py) with prompt padding on; this module
only sets it up with those defaults on the TP/PP lane model of serving/distserve/parallel.py
(iteration latencies from the lane's CostModel: prefill_time over the padded prompt lengths,
decode_time over the context lengths). A request whose sequence could never fit the lane's KV
cache (above the watermark) or the token budget is rejected: its record gets no tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.costmodel import Link
from serving.distserve.disagg import run_lanes
from serving.distserve.parallel import LaneModel, Parallelism, lane_model
from serving.metrics.records import RequestRecord
from serving.sim.config import EngineConfig
from serving.workload.request import Request

# vLLM v0.2.x defaults (see above).
MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, MAX_PADDINGS, BLOCK_SIZE = 4096, 256, 256, 16


def vllm_v0_config(kv_tokens: int, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS) -> EngineConfig:
    """The EngineConfig of one vLLM v0.2-style engine holding `kv_tokens` tokens of KV."""
    return EngineConfig(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=MAX_NUM_SEQS,
        block_size=BLOCK_SIZE,
        num_kv_blocks=max(1, kv_tokens // BLOCK_SIZE),
        scheduler="v0",
        v0_pad_prompts=True,
        v0_max_paddings=MAX_PADDINGS,
    )


def run_vllm_v0(
    requests: Sequence[Request],
    lane: LaneModel,
    instances: int = 1,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
) -> list[RequestRecord]:
    """Serve `requests` round-robin on `instances` x lanes vLLM v0.2-style engines; records by req_id."""
    return run_lanes(
        requests, lane, instances, vllm_v0_config(lane.kv_tokens_per_lane, max_num_batched_tokens)
    )


def run_colocated_vllm_v0(
    requests: Sequence[Request],
    model: str,
    gpu: str,
    par: Parallelism,
    instances: int,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    stage_link: Link | None = None,
) -> list[RequestRecord]:
    """Serve `requests` on `instances` colocated vLLM v0.2-style engines of parallelism `par`.

    `stage_link` joins pipeline stages; by default the GPU's NVLink (`parallel.nvlink`).
    """
    return run_vllm_v0(requests, lane_model(model, gpu, par, stage_link), instances, max_num_batched_tokens)
