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

from serving.policies.base import SchedContext
from serving.sim.state import FINISHED, RUNNING, WAITING, SimRequest

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
    policy = engine.policy
    budget = cfg.max_num_batched_tokens
    ctx = SchedContext(engine.now, engine.stats.iterations, budget, kv.free, kv.total, bs, cfg.max_num_seqs)
    running = list(policy.order_running(engine.running, ctx))
    waiting = list(policy.order_waiting(engine.waiting, ctx)) if engine.waiting else []
    watermark = watermark_blocks(kv.total)

    pres: list[SimRequest] = []  # prompts (or recomputed sequences) prefilled whole
    chunks: list[int] = []
    pad = cfg.v0_pad_prompts
    max_pad = cfg.v0_max_paddings
    longest = 0  # the batch's longest prompt (what padding pads to)
    if waiting:
        slots = cfg.max_num_seqs - len(running)
        limit = policy.admission_limit(running, waiting, ctx)
        if limit is not None:
            slots = min(slots, limit)
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
            kv.free -= need
            r.blocks = need
            r.state = RUNNING
            r.admission_seq = engine._admissions
            engine._admissions += 1
            running.append(r)
            pres.append(r)
            chunks.append(new)
            budget -= new
            slots -= 1
        if pres:
            engine.waiting = [r for r in engine.waiting if r.state == WAITING]

    decs: list[SimRequest] = []
    dctx: list[int] = []
    preempted = False
    xfer = 0.0
    if not pres:  # a decode iteration: every running request, preempting from the end when short
        i = 0
        while i < len(running):
            r = running[i]
            seq = r.num_prompt_tokens + r.num_output_tokens
            need = -(-seq // bs) - r.blocks
            while need > kv.free:
                victim = running.pop()
                xfer += engine._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.state != RUNNING:
                break
            kv.free -= max(need, 0)
            r.blocks += max(need, 0)
            decs.append(r)
            dctx.append(seq)
            i += 1

    if not decs and not pres and xfer == 0.0:
        engine.running = running
        return False, False
    dt = engine.cost.iteration_time([longest] * len(chunks) if pad else chunks, dctx) + xfer
    engine.stats.transfer_seconds += xfer
    start = engine.now
    now = start + dt
    engine.now = now
    engine.stats.iterations += 1
    finished = False
    for r, n in [(r, 1) for r in decs] + list(zip(pres, chunks, strict=True)):
        r.computed += n
        r.num_output_tokens += 1
        r.token_times.append(now)
        if r.num_output_tokens == r.target_output_tokens:
            r.state = FINISHED
            kv.free += r.blocks
            r.blocks = 0
            finished = True
    engine.running = [r for r in running if r.state == RUNNING] if finished else running
    if engine.on_iteration is not None:
        engine.on_iteration(start, dt, sum(chunks), len(dctx), xfer)
    plain = not (pres or preempted or finished or xfer or engine.waiting)
    return True, plain
