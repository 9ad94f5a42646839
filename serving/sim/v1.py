"""One iteration of vLLM V1's scheduler (chunked prefill, decodes first), the engine's default step.

An iteration (one forward pass), once `EngineSim.run` has let timed changes and arrivals in:
  1. The policy orders the running and waiting requests and may pick rotations, which are
     preempted at once (they queue behind the waiting requests for this iteration).
  2. Running requests are scheduled in service order: each gets its decode token or its next
     prefill chunk (prefill tokens limited by the policy's prefill cap and the token budget). When
     a KV block allocation fails, the LAST request of the service order is preempted, repeatedly
     until the allocation fits; a request that is itself last preempts itself and scheduling of
     running requests stops (vLLM V1).
  3. If no allocation failed, waiting requests are admitted in the policy's order while budget,
     blocks and sequence slots last (and at most `policy.admission_limit(...)` of them); the first
     that does not fit stops admission (vLLM V1: no admission in a step that preempted).
  4. The iteration lasts `CostModel.iteration_time(chunks, decode contexts)` plus the transfer
     time of any KV saved or restored in it; every request whose sequence is then fully computed
     emits a token at the iteration's end (serving/sim/iteration.py `end_iteration`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.sim.iteration import Batch, admission_slots, admit, end_iteration, make_room, order_queues
from serving.sim.state import RUNNING, WAITING

if TYPE_CHECKING:
    from serving.sim.engine import EngineSim


def step_v1(engine: EngineSim) -> tuple[bool, bool]:
    """One V1 iteration of `engine`. Returns (anything scheduled, plain decode-only iteration)."""
    kv = engine.kv
    bs = kv.block_size
    policy = engine.policy
    budget = engine.config.max_num_batched_tokens
    ctx, running, waiting = order_queues(engine)
    rotated = policy.select_rotations(running, waiting, ctx)
    xfer = engine._pending_xfer
    engine._pending_xfer = 0.0
    if rotated:
        gone = {id(r) for r in rotated}
        if len(gone) != len(rotated) or any(r.state != RUNNING for r in rotated):
            raise ValueError(f"policy {policy.name!r} rotated requests that are not running, or twice")
        running = [r for r in running if id(r) not in gone]
        for r in rotated:
            xfer += engine._preempt(r)
        waiting.extend(rotated)  # they yield, this iteration, to requests already waiting
        engine.stats.rotations += len(rotated)
    if engine._default_cap:
        pbudget = budget  # the base class's cap: the whole budget (the call has no effect)
    else:
        ndec = 0
        for r in running:
            if r.num_output_tokens and r.computed == r.num_prompt_tokens + r.num_output_tokens - 1:
                ndec += 1
        pbudget = min(max(policy.prefill_token_cap(ctx, ndec), 0), budget)

    batch = Batch()
    decs, dctx = batch.decs, batch.dctx  # (the hot path appends to them directly)
    preempted = False
    i = 0
    while i < len(running):
        r = running[i]
        seq = r.num_prompt_tokens + r.num_output_tokens
        new = seq - r.computed
        if new == 1 and r.num_output_tokens:
            if budget < 1:
                i += 1
                continue
            is_decode = True
            need = (seq + bs - 1) // bs - r.blocks
            if need <= 0:  # hot path: the token fits in the request's last block
                decs.append(r)
                dctx.append(seq)
                budget -= 1
                i += 1
                continue
        else:
            new = min(new, budget, pbudget)
            if new <= 0:
                i += 1
                continue
            is_decode = False
            need = (r.computed + new + bs - 1) // bs - r.blocks
        if need > kv.free:
            xfer = make_room(engine, running, r, need, xfer)
            preempted = True
        if r.state != RUNNING:
            break
        kv.free -= need
        r.blocks += need
        budget -= new
        pbudget -= batch.add(r, seq, new, is_decode)
        i += 1

    admitted = 0
    if not preempted and waiting:
        slots = admission_slots(engine, running, waiting, ctx)
        for r in waiting:
            if slots <= 0 or budget <= 0:
                break
            seq = r.num_prompt_tokens + r.num_output_tokens
            new = seq - r.computed
            is_decode = new == 1 and r.num_output_tokens > 0
            if not is_decode:
                new = min(new, budget, pbudget)
                if new <= 0:
                    break
            need = (r.computed + new + bs - 1) // bs
            if need > kv.free:
                break
            if r.offloaded_bytes and engine.store is not None:
                xfer += engine.store.restore(r)
            admit(engine, r, need, running)
            slots -= 1
            admitted += 1
            budget -= new
            pbudget -= batch.add(r, seq, new, is_decode)
        if admitted:
            engine.waiting = [r for r in engine.waiting if r.state == WAITING]

    finished = end_iteration(engine, running, batch, xfer, batch.chunks)
    if finished is None:
        return False, False
    changed = batch.chunks or rotated or preempted or admitted or finished or xfer
    plain = not changed and len(dctx) == len(running)
    return True, plain
