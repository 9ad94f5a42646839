"""Aqua's completely fair scheduling (CFS) adapted to chunked prefill.

Each request's service is the work done for it: prompt tokens processed plus tokens generated.
Once a request has generated a token its whole prompt counts as served, even if a recompute
preemption threw that KV away, so service never decreases.

  * order_waiting: least service first (new requests before preempted ones that were served).
  * order_running: the requests still prefilling (no token generated yet) first, fewest prompt
    tokens computed first, then the decoding ones, fewest tokens generated first: prefill chunks
    go to the prompts with the least prefill progress and decode slots to the requests with the
    fewest generated tokens, and the request that generated the most is last, i.e. the first
    victim when a KV allocation fails (the engines preempt from the end). Not by service: among
    decodes, a long prompt with a few tokens generated would go after a short prompt with many.
    Prefills go before decodes, where service put them whenever prompts are of similar length (a
    prefill's service is below its prompt's length, a decode's above it), so no prompt is the
    victim, losing its progress before its first token (as select_rotations avoids too), while a
    decode holds KV; decodes lose no step's token by it, prefill_token_cap keeps theirs. A request
    recomputing its KV after a preemption has generated tokens and counts as decoding. Rotation
    victims are still chosen by service.
  * select_rotations: time slicing. A request that has run `slice_iters` iterations since its
    admission (the admitting iteration included) may be preempted in favour of a waiting request
    that has `min_service_gap` fewer tokens of service, when the waiting request cannot get its KV
    blocks or a running slot otherwise. A waiting request that has received no service at all (a
    new arrival) may instead preempt any request that has had its first token and has run
    `first_slice_iters` iterations (default 1): the equivalent of Linux CFS's wakeup preemption,
    where a woken task whose vruntime trails the running one's preempts it without waiting for the
    end of its slice (Documentation/scheduler/sched-design-CFS.rst). This bounds a burst's TTFT by
    one iteration per wave of `max_running` new requests instead of a full slice per wave; victims
    rejoin the queue as served requests, so the slice and the gap still keep served requests from
    thrashing among themselves. Most served victims go first; rotations are planned only when
    they let the waiting request in: a victim frees the blocks of the tokens whose KV it holds
    (a decoding request's last sampled token has none yet) less those it shares with requests
    that keep running (vLLM's prefix caching), the waiting request takes the blocks of its
    sequence less its prefix-cache hits on blocks that stay referenced, and the running requests
    that stay take their blocks for this step's decodes and prefill chunks before anyone is
    admitted.
    No request is rotated out before its first token, whichever request waits: a rotation never
    delays a TTFT, and it never lowers a victim's service. (With recompute preemption a prompt
    rotated out mid-prefill would lose its progress and come back with service 0, i.e. as a new
    arrival entitled to wakeup preemption: two long prompts, or a long prompt and a resumed request,
    could then evict each other forever without either finishing its prefill.)
  * Bounded wait (aging): least service first starves a served request under sustained overload,
    since new arrivals (service 0) always queue ahead of it and its rotation needs a victim
    `min_service_gap` ahead of it. A served request that has waited `max_wait_iters` engine
    iterations since it last joined the waiting queue is aged: it is ordered before every other
    waiting request (the longest waiting first) and may rotate out the most served running requests
    (past their first token and their slice) whatever its own service. Once admitted, an aged
    request runs its full `slice_iters`, counted from its first decode (after a recompute
    preemption it prefills its sequence again first), before anyone, a new arrival included, may
    rotate it out, and meanwhile it is served first, so it is not the engine's first victim when a
    KV allocation fails: every such wait buys it `slice_iters` new tokens. New arrivals do not age:
    they are served first come first served among themselves, ahead of the served requests, and
    aging them too would queue an overload's whole backlog ahead of an aged request again.
  * prefill_token_cap: prefill chunks may use the budget left after one token for every decode,
    so prefills never starve decodes.

With the Aqua KV connector a rotation costs one KV copy out and back, not a recompute
(Aqua, Vijaya Kumar et al., "Aqua: Network-Accelerated Memory Offloading for LLMs in Scale-Up
GPU Domains", ASPLOS 2025).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from serving.policies.base import (
    IdKey,
    R,
    SchedContext,
    SchedRequest,
    SchedulingPolicy,
    id_key,
    kv_blocks_freed_by_preemption,
    kv_blocks_taken_by_admission,
)
from serving.policies.registry import register_policy


def service(r: SchedRequest) -> int:
    """Tokens of work done for `r`: prompt processed (all of it once decoding began) + generated."""
    generated = r.num_output_tokens
    return (r.num_prompt_tokens if generated > 0 else r.num_computed_prompt_tokens) + generated


def _key(r: SchedRequest) -> tuple[int, float, IdKey]:
    return (service(r), r.arrival_time, id_key(r.req_id))


def _running_key(r: SchedRequest) -> tuple[bool, int, float, IdKey]:
    """order_running's key: prefills by prompt tokens computed, then decodes by tokens generated."""
    generated = r.num_output_tokens
    return (generated > 0, generated or r.num_computed_prompt_tokens, r.arrival_time, id_key(r.req_id))


def _blocks(tokens: int, ctx: SchedContext) -> int:
    return -(-tokens // ctx.block_size)


def _tokens_left(r: SchedRequest) -> int:
    """Tokens `r` has to compute: 1 for a decode, else what is left of its (re)prefill."""
    return r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens


class _StepGrowth:
    """The most KV blocks and tokens the running requests can take this step before admission.

    The engine (the simulator and vLLM alike) schedules running requests before it admits waiting
    ones, so what they take comes out of what a rotation frees: a decode takes one token (plus its
    speculative drafts, `num_draft_tokens`) and a block when they start one, a prefill chunk its
    tokens and the blocks it fills. The chunks share the step's token budget, so together they
    fill at most budget / block_size blocks plus a partial one each.
    """

    def __init__(self, running: Sequence[SchedRequest], ctx: SchedContext) -> None:
        self._ctx = ctx
        self.decode_blocks = 0
        self.prefill_blocks = 0
        self.prefills = 0
        self.wanted_tokens = 0
        for r in running:
            self._add(r, 1)

    def _add(self, r: SchedRequest, sign: int) -> None:
        held = r.num_computed_tokens
        left = _tokens_left(r)
        decode = left == 1 and r.num_output_tokens > 0
        # A decode also computes its speculative drafts this step, and takes their KV blocks.
        drafts = int(getattr(r, "num_draft_tokens", 0) or 0) if decode else 0
        tokens = min(left + drafts, self._ctx.token_budget)
        grown = _blocks(held + tokens, self._ctx) - _blocks(held, self._ctx)
        self.wanted_tokens += sign * tokens
        if decode:
            self.decode_blocks += sign * grown
        else:
            self.prefill_blocks += sign * grown
            self.prefills += sign

    def remove(self, r: SchedRequest) -> None:
        """`r` is rotated out: it takes nothing this step."""
        self._add(r, -1)

    @property
    def blocks(self) -> int:
        chunks_bound = self._ctx.token_budget // self._ctx.block_size + self.prefills
        return self.decode_blocks + min(self.prefill_blocks, chunks_bound)


@register_policy("aqua")
class AquaFairPolicy(SchedulingPolicy):
    """Completely fair: serve the least served first; rotate the most served out on a time slice.

    Args:
        slice_iters: Iterations a request runs after admission before it may be rotated out.
        min_service_gap: Minimum service lead (tokens) of a victim over the request it yields to;
            at least 1, else two requests with equal service could take turns rotating each other
            out, and with recompute preemption neither would ever get back to a new token.
        first_slice_iters: The slice when the waiting request has had no service yet (a new
            arrival); at most `slice_iters`.
        max_wait_iters: Engine iterations a served request may wait (since it last joined the
            waiting queue) before it is aged (see the module docstring); a positive integer.
            Iterations, like the slices, so that a setting means the same in the simulator and in
            vLLM whatever the hardware's step time. The default, 1000 (10-50 s at 10-50 ms a step),
            is over 10x the longest wait of the burst the policy is designed for, which it leaves
            unchanged: in the simulator, 8 requests of 1,500 output tokens rotated out by a burst of
            16 short ones (tests/vllm_aqua/test_aqua_policy_sim.py) waited at most 95 iterations
            (56 with recompute preemption), and every token came at the same time with the
            default as without the guard. Waits beyond it come from overload: over the random
            KV-bound workloads of tests/serving/test_aqua_rotations.py served requests waited up
            to 1,957 iterations without the guard.
    """

    def __init__(
        self,
        slice_iters: int = 4,
        min_service_gap: int = 16,
        first_slice_iters: int = 1,
        max_wait_iters: int = 1000,
    ) -> None:
        if slice_iters <= 0:
            raise ValueError(f"{slice_iters=} must be positive")
        if min_service_gap < 1:
            raise ValueError(f"{min_service_gap=} must be >= 1")
        if not 0 < first_slice_iters <= slice_iters:
            raise ValueError(f"{first_slice_iters=} must be in [1, {slice_iters=}]")
        if not isinstance(max_wait_iters, int) or isinstance(max_wait_iters, bool) or max_wait_iters < 1:
            raise ValueError(f"max_wait_iters must be a positive integer, got {max_wait_iters!r}")
        self.slice_iters = slice_iters
        self.first_slice_iters = first_slice_iters
        self.min_service_gap = min_service_gap
        self.max_wait_iters = max_wait_iters
        # (req_id, admission_seq) -> iteration at which the policy first saw that admission running
        # (the one after the iteration that admitted it: order_running runs before admission).
        self._admitted_at: dict[tuple[Hashable, int], int] = {}
        # req_id -> iteration at which the policy first saw the request in its current wait.
        self._waiting_since: dict[Hashable, int] = {}
        self._aged: set[Hashable] = set()  # waiting requests aged at the last order_waiting
        # Admissions of aged requests still inside their guaranteed slice -> the iteration the
        # slice began (the first at which the policy saw it decoding), None while it (re)prefills.
        self._protected: dict[tuple[Hashable, int], int | None] = {}

    def order_waiting(self, waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        since = self._waiting_since
        oldest = ctx.iteration - self.max_wait_iters
        served: set[Hashable] = set()
        aged: list[R] = []
        for r in waiting:
            if service(r) == 0:  # a new arrival: first come first served among its peers
                continue
            served.add(r.req_id)
            if since.setdefault(r.req_id, ctx.iteration) <= oldest:
                aged.append(r)
        if len(since) != len(served):
            for k in [k for k in since if k not in served]:
                del since[k]
        self._aged = {r.req_id for r in aged}
        if not aged:
            return sorted(waiting, key=_key)
        rest = [r for r in waiting if r.req_id not in self._aged]
        return sorted(aged, key=lambda r: (since[r.req_id], *_key(r))) + sorted(rest, key=_key)

    def order_running(self, running: Sequence[R], ctx: SchedContext) -> list[R]:
        admitted = self._admitted_at
        if len(running) != len(admitted) or any((r.req_id, r.admission_seq) not in admitted for r in running):
            seen = {(r.req_id, r.admission_seq) for r in running}
            for k in [k for k in admitted if k not in seen]:
                del admitted[k]
                self._protected.pop(k, None)
            for r in running:
                k = (r.req_id, r.admission_seq)
                if k not in admitted:  # admitted in the last iteration: its wait is over
                    admitted[k] = ctx.iteration
                    self._waiting_since.pop(r.req_id, None)
                    if r.req_id in self._aged:
                        self._aged.discard(r.req_id)
                        self._protected[k] = None
        protected = self._protected
        if not protected:
            return sorted(running, key=_running_key)
        # The slice starts once its sequence is computed again: a recompute preemption threw its KV
        # away, and a slice spent prefilling it again would rotate it out without a new token.
        for r in running:
            k = (r.req_id, r.admission_seq)
            if k in protected and protected[k] is None and r.num_output_tokens > 0 and _tokens_left(r) <= 1:
                protected[k] = ctx.iteration
        for k in [
            k
            for k, start in protected.items()
            if start is not None and ctx.iteration + 1 - start >= self.slice_iters
        ]:
            del protected[k]
        return sorted(running, key=lambda r: ((r.req_id, r.admission_seq) not in protected, *_running_key(r)))

    def select_rotations(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        if not waiting or not running:
            return []
        since = self._admitted_at
        protected = self._protected

        def ran(r: R) -> int:  # iterations run since admission, the admitting one included
            return ctx.iteration + 1 - since.get((r.req_id, r.admission_seq), ctx.iteration + 1)

        # Most served first (by service, not the running order); waiting is least served first
        # after the aged ones, so once a request that is not aged finds no victim with a large
        # enough service lead, no later one would either (and the engine admits no one behind a
        # request it cannot admit).
        by_service = sorted(running, key=_key, reverse=True)
        growth = _StepGrowth(running, ctx)
        free = ctx.free_kv_blocks  # plus the victims' blocks, less those the admitted ones need
        slots = ctx.max_running - len(running)
        admitted_tokens = 0  # the most tokens the waiting requests planned for take
        victims: list[R] = []
        for w in waiting:
            # vLLM admits a request with blocks for its whole sequence so far (prompt and output
            # tokens; its `full_sequence_must_fit` gate), the simulator with those of its first chunk.
            full_need = need = _blocks(w.num_prompt_tokens + w.num_output_tokens, ctx)
            if need > ctx.total_kv_blocks:
                continue
            if free - growth.blocks < need:  # less where its prefix hits blocks others keep
                need = kv_blocks_taken_by_admission(w, victims, ctx)
            taken = {id(v) for v in victims}
            new_arrival = service(w) == 0
            # A new arrival needs no service lead over its victims, nor does an aged request
            # (waiting has the aged ones first), which may rotate out less served requests too.
            gap = None if new_arrival or w.req_id in self._aged else self.min_service_gap
            # Wakeup preemption (a new arrival) after the first slice, else after the full slice,
            # and an aged admission's slice is always the full one; either way only requests past
            # their first token (see the module docstring).
            slice_iters = self.first_slice_iters if new_arrival else self.slice_iters
            pool = [
                r
                for r in by_service
                if id(r) not in taken
                and r.num_output_tokens > 0
                and (r.req_id, r.admission_seq) not in protected
                and ran(r) >= slice_iters
            ]
            candidates = iter(pool)
            planned: list[R] = []
            gained_blocks = 0
            gained_slots = 0
            while free + gained_blocks - growth.blocks < need or slots + gained_slots < 1:
                v = next(candidates, None)
                if v is None or (gap is not None and service(v) - service(w) < gap):
                    return victims
                gained_blocks += kv_blocks_freed_by_preemption(v, [*victims, *planned], ctx)
                planned.append(v)
                growth.remove(v)
                gained_slots += 1
                if need < full_need:  # its hits on blocks only `v` kept are hits no more
                    need = kv_blocks_taken_by_admission(w, [*victims, *planned], ctx)
            if growth.wanted_tokens + admitted_tokens >= ctx.token_budget:
                return victims  # no budget left for `w` (nor for anyone after it) this step
            victims.extend(planned)
            admitted_tokens += _tokens_left(w)
            free += gained_blocks - need
            slots += gained_slots - 1
        return victims

    def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
        return max(0, ctx.token_budget - num_decodes)
