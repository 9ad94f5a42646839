"""What every scheduler step of `EngineSim` does alike (serving/sim/v1.py and serving/sim/v0.py).

A step orders the queues (`order_queues`), admits waiting requests within `admission_slots`
(`admit` does the bookkeeping), preempts from the end of the running order when blocks are short
(`make_room`), gathers the iteration's work in a `Batch`, and ends with `end_iteration`: the clock
advances by the iteration's cost plus its KV transfers, and every request whose sequence is then
fully computed emits a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.policies.base import SchedContext
from serving.sim.state import FINISHED, RUNNING, SimRequest

if TYPE_CHECKING:
    from serving.sim.engine import EngineSim


class Batch:
    """The work of one iteration: decodes (with their context lengths) and prefill chunks."""

    __slots__ = ("chunks", "dctx", "decs", "pres")

    def __init__(self) -> None:
        self.decs: list[SimRequest] = []  # requests decoding one token this iteration
        self.dctx: list[int] = []  # their context lengths
        self.pres: list[SimRequest] = []  # requests prefilling a chunk this iteration
        self.chunks: list[int] = []  # their chunk lengths

    def add(self, r: SimRequest, seq: int, new: int, is_decode: bool) -> int:
        """Add `r` (sequence length `seq`) for `new` tokens; returns the prefill tokens it takes."""
        if is_decode:
            self.decs.append(r)
            self.dctx.append(seq)
            return 0
        self.pres.append(r)
        self.chunks.append(new)
        return new


def order_queues(engine: EngineSim) -> tuple[SchedContext, list[SimRequest], list[SimRequest]]:
    """The policy's view of this iteration and its (running, waiting) service orders."""
    cfg = engine.config
    kv = engine.kv
    ctx = SchedContext(
        engine.now,
        engine.stats.iterations,
        cfg.max_num_batched_tokens,
        kv.free,
        kv.total,
        kv.block_size,
        cfg.max_num_seqs,
    )
    policy = engine.policy
    running = list(policy.order_running(engine.running, ctx))
    waiting = list(policy.order_waiting(engine.waiting, ctx)) if engine.waiting else []
    return ctx, running, waiting


def admission_slots(
    engine: EngineSim, running: list[SimRequest], waiting: list[SimRequest], ctx: SchedContext
) -> int:
    """How many waiting requests may join: free sequence slots, capped by the policy's limit."""
    slots = engine.config.max_num_seqs - len(running)
    limit = engine.policy.admission_limit(running, waiting, ctx)
    return slots if limit is None else min(slots, limit)


def admit(engine: EngineSim, r: SimRequest, need: int, running: list[SimRequest]) -> None:
    """Start `r` running with `need` fresh blocks, at the end of the service order."""
    engine.kv.free -= need
    r.blocks = need
    r.state = RUNNING
    r.admission_seq = engine._admissions
    engine._admissions += 1
    running.append(r)


def make_room(engine: EngineSim, running: list[SimRequest], r: SimRequest, need: int, xfer: float) -> float:
    """Preempt the last of `running` until `need` blocks are free or `r` itself went (vLLM).

    Returns `xfer` plus the transfer seconds of the preemptions (added one by one, in order).
    """
    while need > engine.kv.free:
        victim = running.pop()
        xfer += engine._preempt(victim)
        if victim is r:
            break
    return xfer


def end_iteration(
    engine: EngineSim,
    running: list[SimRequest],
    batch: Batch,
    xfer: float,
    costed_chunks: list[int],
) -> int | None:
    """Run the iteration of `batch`, with `xfer` seconds of KV transfers.

    `costed_chunks` are the prefill lengths the cost model charges (`batch.chunks`, or a padded
    batch's).

    Returns:
        How many requests finished, or None when the iteration had nothing to do (no token and no
        transfer); `engine.running` becomes `running` without the finished requests.
    """
    decs, dctx, pres, chunks = batch.decs, batch.dctx, batch.pres, batch.chunks
    if not decs and not pres and xfer == 0.0:
        engine.running = running
        return None
    kv = engine.kv
    stats = engine.stats
    dt = engine.cost.iteration_time(costed_chunks, dctx)
    if xfer:
        dt += xfer
        stats.transfer_seconds += xfer
    start = engine.now
    now = start + dt
    engine.now = now
    stats.iterations += 1
    finished = 0
    for r in decs:  # a decode always completes the sequence: one more token
        r.computed += 1
        out = r.num_output_tokens + 1
        r.num_output_tokens = out
        r.token_times.append(now)
        if out == r.target_output_tokens:
            r.state = FINISHED
            kv.free += r.blocks
            r.blocks = 0
            finished += 1
    for r, new in zip(pres, chunks, strict=True):
        r.computed += new
        if r.computed == r.num_prompt_tokens + r.num_output_tokens:  # last chunk: first token
            r.num_output_tokens += 1
            r.token_times.append(now)
            if r.num_output_tokens == r.target_output_tokens:
                r.state = FINISHED
                kv.free += r.blocks
                r.blocks = 0
                finished += 1
    engine.running = [r for r in running if r.state == RUNNING] if finished else running
    if engine.on_iteration is not None:
        engine.on_iteration(start, dt, sum(chunks), len(dctx), xfer)
    return finished
