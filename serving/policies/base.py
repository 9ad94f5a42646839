"""The scheduling-policy interface shared by the simulator and the vLLM scheduler plug-in.

A policy is consulted once per engine iteration and decides:
  (a) order_waiting:     the admission order of waiting requests;
  (b) order_running:     the service order of running requests. The engine serves running requests
                         in this order and, when a KV block allocation fails, preempts from the END
                         of the list (the last request is the first victim);
  (c) select_rotations:  running requests to preempt voluntarily now (time slicing), so that
                         waiting requests get a turn even when no allocation has failed;
  (d) prefill_token_cap: how much of the iteration's token budget prefill chunks may use; decodes
                         (one token each) are not limited by it;
  (e) admission_limit:   (optional) how many waiting requests may be admitted this iteration.

Policies see requests only through the `SchedRequest` protocol, which both the simulator's request
state and the vLLM adapter implement, so one policy object runs unchanged in both. What only an
engine with shared KV blocks can tell (prefix caching) is optional: `kv_blocks_freed_by_preemption`
and `kv_blocks_taken_by_admission` read it where a request provides it and estimate it elsewhere.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar


class SchedRequest(Protocol):
    """What a policy may read about a request (read-only)."""

    @property
    def req_id(self) -> Hashable: ...

    @property
    def arrival_time(self) -> float:
        """Seconds; same clock as `SchedContext.now`."""
        ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_computed_prompt_tokens(self) -> int:
        """Prompt tokens whose KV is computed (prefill progress); 0 after a recompute preemption."""
        ...

    @property
    def num_computed_tokens(self) -> int:
        """Tokens (prompt and output) whose KV is computed: what the request's KV blocks hold.

        A decoding request holds one token less than its sequence: the last sampled token's KV is
        computed by its next step (vLLM's `Request.num_computed_tokens`).
        """
        ...

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far; never decreases, even across preemptions."""
        ...

    @property
    def admission_seq(self) -> int:
        """Monotonic sequence number of the request's latest admission to the running set."""
        ...

    @property
    def num_preemptions(self) -> int: ...

    @property
    def predicted_output_tokens(self) -> int | None:
        """A response-length prediction when a predictor is configured, else None."""
        ...

    @property
    def slo_class(self) -> str | None:
        """The request's SLO class (e.g. its application); None for the engine's default SLO."""
        ...

    @property
    def max_output_tokens(self) -> int | None:
        """The most tokens the response may have (vLLM's `max_tokens`); None when uncapped."""
        ...

    # Optional members (not required; see the functions of the same names below), each answering
    # None when the request cannot tell:
    #   def kv_blocks_freed_by_preemption(self, preempted: Sequence[SchedRequest]) -> int | None
    #       KV blocks preempting this running request returns to the engine's free pool once the
    #       requests in `preempted` are preempted too.
    #   def kv_blocks_taken_by_admission(self, preempted: Sequence[SchedRequest]) -> int | None
    #       KV blocks admitting this waiting request takes from the free pool once the requests in
    #       `preempted` are preempted.
    #   num_draft_tokens: int
    #       Speculative draft tokens a decoding request computes (and takes KV for) in the next
    #       step besides its last sampled token; 0 when absent (no speculative decoding).


R = TypeVar("R", bound=SchedRequest)


@dataclass(frozen=True, slots=True)
class SchedContext:
    """Engine state a policy may read at the start of an iteration.

    Attributes:
        now: Current time in seconds.
        iteration: Engine iteration counter, starting at 0.
        token_budget: Max tokens (prefill chunk tokens + decode tokens) in this iteration.
        free_kv_blocks: KV blocks not held by any request.
        total_kv_blocks: KV cache capacity in blocks.
        block_size: Tokens per KV block.
        max_running: Max number of running sequences.
    """

    now: float
    iteration: int
    token_budget: int
    free_kv_blocks: int
    total_kv_blocks: int
    block_size: int
    max_running: int


IdKey = tuple[int, int | str]


def id_key(req_id: Hashable) -> IdKey:
    """A request id as the last tie-breaker of an order: integers (the simulator's dense ids, in
    arrival order) by value, any other id (vLLM's strings) by its text. Comparing str(req_id) alone
    put request 10 before request 2 among requests that arrived at the same time."""
    # Integral, not int: numpy's integers (ids taken from an array) are no int subclass, and ordered
    # as text they put 10 before 2 again.
    if isinstance(req_id, numbers.Integral) and not isinstance(req_id, bool):
        return (0, int(req_id))
    return (1, str(req_id))


def kv_blocks_freed_by_preemption(
    r: SchedRequest, preempted: Sequence[SchedRequest], ctx: SchedContext
) -> int:
    """KV blocks that preempting `r` after the requests in `preempted` returns to the free pool.

    A request that knows (the vLLM adapter, from the engine's block table) answers through its
    optional method of this name: with prefix caching, a block shared with requests that keep
    running stays allocated, and one shared only with `preempted` is freed by the last of them.
    Otherwise every block of the tokens whose KV `r` holds counts (no sharing, as in the
    simulator).
    """
    exact = getattr(r, "kv_blocks_freed_by_preemption", None)
    freed: int | None = exact(preempted) if exact is not None else None
    return -(-r.num_computed_tokens // ctx.block_size) if freed is None else freed


def kv_blocks_taken_by_admission(
    r: SchedRequest, preempted: Sequence[SchedRequest], ctx: SchedContext
) -> int:
    """KV blocks that admitting the waiting request `r` takes, once `preempted` are preempted.

    A request that knows (the vLLM adapter, from the prefix cache) answers through its optional
    method of this name: a prompt prefix whose blocks other requests keep referenced takes no new
    ones. Otherwise the blocks of its whole sequence so far (prompt and output tokens), the most
    an engine admits a request with.
    """
    exact = getattr(r, "kv_blocks_taken_by_admission", None)
    taken: int | None = exact(preempted) if exact is not None else None
    return -(-(r.num_prompt_tokens + r.num_output_tokens) // ctx.block_size) if taken is None else taken


class SchedulingPolicy(ABC):
    """Base class of every scheduling policy; subclasses register themselves by `name`."""

    name: ClassVar[str]
    # True when the policy's decisions cannot change while only output-token counts and time
    # advance (no waiting request, every running one decoding); lets the simulator fast-forward.
    decode_invariant: ClassVar[bool] = False

    @abstractmethod
    def order_waiting(self, waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        """Admission order of the waiting queue.

        Called before new requests are admitted: once per iteration, and a second time with the
        same `ctx.iteration` in the vLLM plug-in when rotations moved victims to the waiting queue
        (so per-iteration bookkeeping must not count both calls). The plug-in skips the call when
        nothing waits.

        Args:
            waiting: Requests not running (new or preempted), in arrival order.
            ctx: Engine state.

        Returns:
            The same requests, first to admit first.
        """

    @abstractmethod
    def order_running(self, running: Sequence[R], ctx: SchedContext) -> list[R]:
        """Service order of running requests; the last one is the first preemption victim.

        Called once per iteration before any running request is scheduled.

        Args:
            running: Requests holding KV blocks, in the engine's current order.
            ctx: Engine state.

        Returns:
            The same requests, first to serve first.
        """

    def select_rotations(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        """Running requests to preempt now so that waiting ones get a turn (time slicing).

        Called once per iteration after ordering and before scheduling. The default never rotates.

        Args:
            running: Requests in service order (as returned by `order_running`).
            waiting: Requests in admission order (as returned by `order_waiting`).
            ctx: Engine state.

        Returns:
            A subset of `running` to preempt; the engine frees (or offloads) their KV.
        """
        return []

    def admission_limit(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> int | None:
        """How many waiting requests, taken in admission order, may be admitted this iteration.

        Called once per iteration when requests wait, after rotations and before admission. Lets a
        policy hold requests back although blocks, budget and slots would admit them, e.g. to keep
        KV reserved for the predicted lengths of running requests. The default sets no limit
        (vLLM's behaviour).

        Args:
            running: Requests still running after rotations, in service order.
            waiting: Requests in admission order (rotated ones last).
            ctx: Engine state at the start of the iteration.

        Returns:
            None for no limit, else a count >= 0. With nothing running, a limit of 0 stalls the
            engine until the next arrival, so a policy should then allow at least one.
        """
        return None

    def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
        """Max tokens prefill chunks may take this iteration.

        Called once per iteration. The default lets prefills use the whole budget left after
        running requests are served in order (vLLM's behaviour).

        Args:
            ctx: Engine state.
            num_decodes: Running requests that will decode one token each this iteration.

        Returns:
            A token count in [0, ctx.token_budget].
        """
        return ctx.token_budget
