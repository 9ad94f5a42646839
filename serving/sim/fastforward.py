"""Runs of identical decode-only iterations, computed in one go.

Under a policy whose decisions are invariant while only time and output counts advance
(`decode_invariant`), when every running request is decoding and either nobody waits or the last
iteration was decode-only and changed nothing but token counts (no prefill, admission, preemption,
rotation, finish or transfer, so whoever waits stays blocked), the next iterations are the same
batch decoding one more token each, until one of these happens:
  - a request finishes (the run ends with that iteration; finished requests free their blocks);
  - the next timed change or arrival is due (an iteration starts at or after it);
  - the KV blocks the batch must allocate exceed the free blocks (that iteration would preempt).
Waiting requests that could not be admitted stay blocked meanwhile: free blocks only shrink,
sequence slots and the budget left for prefill stay the same.

Iteration j (1-based) of the run decodes every request with context L_i + j - 1 (L_i the
request's current sequence length), so its time is `a + b * S_j + c * n` with S_j = S_1 + n(j - 1),
evaluated with the same float operations as `CostModel.decode_time`. A request holding h blocks
allocates a new block at iterations j0, j0 + block_size, ... where j0 = h * block_size - L_i + 2,
so per-iteration allocation counts repeat with period block_size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.sim.state import FINISHED, RUNNING

if TYPE_CHECKING:
    from serving.sim.engine import EngineSim


def decode_run(engine: EngineSim, stop_time: float) -> int:
    """Advance `engine` by as many identical decode-only iterations as is exact.

    Args:
        engine: An engine whose running requests all decode, with nobody waiting or with the last
            iteration a plain decode-only one (see the module docstring).
        stop_time: No iteration of the run may start at or after this time.

    Returns:
        The number of iterations run (possibly 0).
    """
    running = engine.running
    n = len(running)
    if not n or engine.now >= stop_time:
        return 0
    bs = engine.kv.block_size
    # The run may end with the iteration in which the first requests finish.
    limit = min(r.target_output_tokens - r.num_output_tokens for r in running)
    if limit <= 0 or n > engine.config.max_num_batched_tokens:
        return 0
    # allocs[(j - 1) % bs]: blocks the batch allocates at iteration j. The run has at most `limit`
    # iterations, so a list of min(bs, limit) covers them (a list of bs entries took a block size of
    # 10**20 tokens: OverflowError, or gigabytes for 10**9).
    size = min(bs, limit)
    allocs = [0] * size
    total_ctx = 0
    for r in running:
        seq = r.num_prompt_tokens + r.num_output_tokens
        if r.computed != seq - 1 or not r.num_output_tokens:
            return 0  # mid-prefill: not a decode-only batch
        total_ctx += seq
        first = r.blocks * bs - seq + 1  # (its first allocation is at iteration first + 1)
        if first < size:
            allocs[first] += 1
    d = engine.cost.decode
    a, b, c = d.a, d.b, d.c
    free = engine.kv.free
    t = engine.now
    times: list[float] = []
    j = 0
    while j < limit and t < stop_time:
        need = allocs[j % bs]
        if need > free:
            break
        free -= need
        # Same expression and order as CostModel.decode_time, so the sums are bit-identical.
        dt = a + b * total_ctx + c * n
        if engine.on_iteration is not None:
            engine.on_iteration(t, dt, 0, n, 0.0)
        t = t + dt
        total_ctx += n
        times.append(t)
        j += 1
    if not j:
        return 0
    # Free blocks only shrink over the run, to `free` just before the finishes: write that low
    # point first, as the stepped path passes through it (a KV accountant may watch `free`).
    engine.kv.free = free
    finished = 0
    for r in running:
        r.computed += j
        r.num_output_tokens += j
        r.token_times.extend(times)
        if r.num_output_tokens == r.target_output_tokens:
            # As in the stepped path: the last iteration allocated, then the request frees all.
            r.state = FINISHED
            r.blocks = 0
            free += -(-r.computed // bs)
            finished += 1
        else:
            r.blocks = -(-r.computed // bs)
    if finished:
        engine.running = [r for r in running if r.state == RUNNING]
    engine.kv.free = free
    engine.now = t
    engine.stats.iterations += j
    return j
