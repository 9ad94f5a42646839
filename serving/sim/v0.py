"""One iteration of the paper-era vLLM scheduler (V0, before chunked prefill was the default).

EcoServe (arXiv 2411.06364, 2024) and the other schedulers of its time compare against vLLM's V0
scheduler, whose default path (`Scheduler._schedule_default`, vLLM 0.2-0.5) differs from V1 in
three ways the simulator can show:
  - Prefill first, prefill only: when any waiting request can be admitted, the iteration runs only
    the admitted prompts; running requests do not decode in it (they stall for the whole prefill).
  - No chunking: a prompt (or, after a recompute preemption, prompt plus generated tokens) is
    prefilled in one iteration, so it must fit `max_num_batched_tokens` (V0's default is
    max(max_model_len, 2048): 4,096 for Llama-2).
  - Admission keeps a watermark of free blocks (`watermark` = 1% of the cache) so that running
    requests can still grow; decodes allocate on demand and, when a block is short, the last
    request of the running order is preempted (recompute), repeatedly, as in V1.
The policy still decides both orders and may limit admissions, so FCFS on this step is vLLM V0's
default; the prefill cap and rotations (V1 notions) are not consulted.

With `EngineConfig.v0_pad_prompts`, a prompt batch is padded to its longest prompt as vLLM v0.2's
model runner did (vllm/worker/model_runner.py `_prepare_prompt`; `Scheduler._schedule` admits while
len(batch) x longest fits `max_num_batched_tokens` and the padding fits `max_paddings`): the
iteration costs `prefill_time([longest] * len(batch))`. This is DistServe's colocated baseline
(serving/distserve/vllm_v0.py). Without padding (the default, and benchmarks/ecoserve.py's V0
baseline) a batch costs its prompts' own lengths and their sum must fit the budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.sim.iteration import Batch, admission_slots, admit, end_iteration, make_room, order_queues
from serving.sim.state import RUNNING, WAITING

if TYPE_CHECKING:
    from serving.sim.engine import EngineSim

WATERMARK = 0.01  # vLLM V0's CacheConfig default


def watermark_blocks(total_blocks: int) -> int:
    """Free blocks V0 keeps back at admission (a sequence needing more than total - this is refused)."""
    return int(WATERMARK * total_blocks)


def step_v0(engine: EngineSim) -> tuple[bool, bool]:
    """One V0 iteration of `engine`. Returns (anything scheduled, plain decode-only iteration)."""
    cfg = engine.config
    kv = engine.kv
    bs = kv.block_size
    budget = cfg.max_num_batched_tokens
    ctx, running, waiting = order_queues(engine)
    watermark = watermark_blocks(kv.total)

    batch = Batch()
    pres, chunks = batch.pres, batch.chunks  # prompts (or recomputed sequences) prefilled whole
    pad = cfg.v0_pad_prompts
    max_pad = cfg.v0_max_paddings
    longest = 0  # the batch's longest prompt (what padding pads to)
    if waiting:
        slots = admission_slots(engine, running, waiting, ctx)
        for r in waiting:
            new = r.num_prompt_tokens + r.num_output_tokens - r.computed
            need = -(-(r.computed + new) // bs)
            if pad:
                padded = (len(pres) + 1) * max(longest, new)
                real = cfg.max_num_batched_tokens - budget + new  # the batch's tokens, this one's too
                over = padded > cfg.max_num_batched_tokens or (
                    max_pad is not None and padded - real > max_pad
                )
            else:
                over = new > budget
            if slots <= 0 or over or kv.free - need < watermark:
                break
            longest = max(longest, new)
            admit(engine, r, need, running)
            pres.append(r)
            chunks.append(new)
            budget -= new
            slots -= 1
        if pres:
            engine.waiting = [r for r in engine.waiting if r.state == WAITING]

    decs, dctx = batch.decs, batch.dctx
    preempted = False
    xfer = 0.0
    if not pres:  # a decode iteration: every running request, preempting from the end when short
        i = 0
        while i < len(running):
            r = running[i]
            seq = r.num_prompt_tokens + r.num_output_tokens
            need = -(-seq // bs) - r.blocks
            if need > kv.free:
                xfer = make_room(engine, running, r, need, xfer)
                preempted = True
            if r.state != RUNNING:
                break
            kv.free -= max(need, 0)
            r.blocks += max(need, 0)
            decs.append(r)
            dctx.append(seq)
            i += 1

    costed = [longest] * len(chunks) if pad else chunks
    finished = end_iteration(engine, running, batch, xfer, costed)
    if finished is None:
        return False, False
    plain = not (pres or preempted or finished or xfer or engine.waiting)
    return True, plain
