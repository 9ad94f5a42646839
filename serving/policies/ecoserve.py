"""EcoServe (arXiv 2411.06364) as a scheduling policy: PT/GT queues, length-aware KV reservation.

Requests are prompt tasks (PTs: prompt not fully computed) or generation tasks (GTs: decoding). A
request re-prefilling after a recompute preemption is a PT until its prompt and output are computed
again: it decodes no token before that. The policy's decisions map onto the shared interface as
follows.

order_waiting (the PT queue)
    Preempted GTs first (they hold generated tokens and are already late), then requests that can
    still meet their TTFT, grouped by the bucket of their predicted response length (short first,
    so a batch admitted together finishes together: time-synced batching), least TTFT slack first
    within a bucket, then larger prompts (more KV to fill) last; requests that can no longer meet
    their TTFT go last, in arrival order (they keep their place but do not push feasible ones out).
order_running (the GT queue, then running PTs)
    GTs by KV held, most first, so the preemption victim (the last) is the GT whose recompute costs
    least; then running PTs: those re-prefilling after a preemption first (as in the PT queue),
    then the others by TTFT slack.
admission_limit (KV reservation with pipelining)
    Each running request reserves KV for its prompt plus its predicted response, rounded up to the
    top of its length bucket (a request that outlives its bucket moves to the next) but never
    beyond what it may generate (`max_output_tokens`). With pipelining, reservations are
    trajectories rather than totals: request i holds c_i tokens now, grows one token per iteration
    for s_i more iterations and frees everything when it finishes, so a newcomer may use space that
    others have reserved but will not fill before it is done. A waiting request is admitted only if
    the peak of the summed trajectories (each request's tokens in whole KV blocks) stays within
    `kv_target` of the cache; without pipelining the sum of full reservations must. The decode
    batch is also capped so that a decode-only iteration stays within `decode_share` of the TPOT
    SLO. Requests whose TTFT is already lost (last in the PT queue) are admitted only while the KV
    held by the running requests, with what they would take, stays within `late_kv_share` of the
    cache: under overload a late request that takes the last free blocks holds them for its whole
    response and makes the on-time arrivals behind it late too (the paper orders both queues by SLO
    urgency so that KV goes first to requests that can still meet their SLO). Late requests still
    run whenever the cache is not that full, and every request finishes.
prefill_token_cap (time-synced batching)
    Prefill tokens added to an iteration are capped so that the iteration, with its decodes, stays
    within `sync_factor` x the TPOT SLO (from the cost model); with no decodes, the whole budget.
    TPOT is a mean over a request's tokens, so a factor above 1 lets an iteration that carries a
    prompt run longer than the mean allows while the decode-only ones (capped at `decode_share` of
    the SLO) make up for it.

SLOs are per request: `class_slos` maps a request's `slo_class` (e.g. its application) to its
(TTFT, TPOT) targets and the defaults apply to other requests (the paper's SLOs differ by
application and request). Slack uses the request's own TTFT; the TPOT-based caps use the strictest
TPOT among the requests that share the iteration.

Without a cost model the TTFT slack ignores prefill time and the TPOT-based caps are off. A prediction
beyond the request's `max_output_tokens` (vLLM's `max_tokens`, or the room max_model_len leaves
after the prompt if less; None, uncapped, in the simulator) counts as that many tokens, and no
reservation exceeds it: a bucket's top beyond the cap reserves only the cap. A request without a
prediction is assumed to need `default_prediction` tokens; when that is None (the default) it
reserves only the KV it holds; with no predictions at all there is no reservation: the policy
allocates on demand like vLLM and relies on preemption (victims chosen as above).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from serving.costmodel.model import CostModel
from serving.policies.base import IdKey, R, SchedContext, SchedRequest, SchedulingPolicy, id_key
from serving.policies.registry import register_policy
from serving.predictor.model import DEFAULT_BUCKET_EDGES, bucket_of


@register_policy("ecoserve")
class EcoServePolicy(SchedulingPolicy):
    """EcoServe's queues, ordering, time-synced batching and KV reservation with pipelining."""

    decode_invariant = False  # orders depend on time (SLO slack)

    def __init__(
        self,
        ttft_slo_s: float = 1.0,
        tpot_slo_s: float = 0.1,
        cost: CostModel | None = None,
        bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
        reserve: bool = True,
        pipelining: bool = True,
        kv_target: float = 1.0,
        decode_share: float = 0.8,
        sync_factor: float = 2.0,
        default_prediction: int | None = None,
        late_kv_share: float = 0.5,
        class_slos: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        slos = [(ttft_slo_s, tpot_slo_s), *(class_slos or {}).values()]
        if not all(t > 0 and p > 0 for t, p in slos):
            raise ValueError(f"SLOs must be positive, got {ttft_slo_s=}, {tpot_slo_s=}, {class_slos=}")
        if not 0 < kv_target <= 1 or not 0 < decode_share <= 1:
            raise ValueError(f"{kv_target=} and {decode_share=} must be in (0, 1]")
        if not 0 <= late_kv_share <= 1:
            raise ValueError(f"{late_kv_share=} must be in [0, 1]")
        if not sync_factor > 0:
            raise ValueError(f"{sync_factor=} must be positive")
        if default_prediction is not None and default_prediction < 1:
            raise ValueError(f"{default_prediction=} must be >= 1")
        if not bucket_edges or list(bucket_edges) != sorted(set(bucket_edges)) or bucket_edges[0] != 0:
            raise ValueError(f"{bucket_edges=} must be strictly increasing and start at 0")
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.cost = cost
        self.bucket_edges = tuple(bucket_edges)
        self.reserve = reserve
        self.pipelining = pipelining
        self.kv_target = kv_target
        self.decode_share = decode_share
        self.sync_factor = sync_factor
        self.default_prediction = default_prediction
        self.late_kv_share = late_kv_share
        self.class_slos = dict(class_slos or {})  # slo_class -> (TTFT s, TPOT s)
        self._decode_ctx: list[int] = []  # context lengths of this iteration's GTs (order_running)
        self._tpot_now = tpot_slo_s  # the strictest TPOT SLO among this iteration's GTs

    def slo_of(self, r: SchedRequest) -> tuple[float, float]:
        """(TTFT, TPOT) targets of `r`: its class's entry in `class_slos`, else the defaults."""
        c = r.slo_class
        if c is not None and c in self.class_slos:
            return self.class_slos[c]
        return self.ttft_slo_s, self.tpot_slo_s

    # -- request views -------------------------------------------------------------------------

    def predicted_output(self, r: SchedRequest) -> int:
        """Tokens reserved for the response: the upper edge of the predicted length's bucket.

        A request that outlives its bucket moves to the next one (past the last edge, buckets keep
        doubling). Never more than the request's `max_output_tokens`: it cannot generate more, so
        a bucket top beyond it reserved KV no request would fill. A request with no prediction (and
        no `default_prediction`) reads as finishing with its next token: it reserves nothing beyond
        what it holds.
        """
        pred = r.predicted_output_tokens
        if pred is None:  # not `or`: a prediction of 0 tokens is a prediction (bucket 0)
            pred = self.default_prediction
        cap = r.max_output_tokens
        if pred is not None and cap is not None:
            pred = min(pred, cap)  # the response cannot outgrow it, whatever the client predicted
        out = r.num_output_tokens
        if pred is None:
            return out + 1
        top = self._bucket_top(max(pred, out + 1))
        return top if cap is None else min(top, max(cap, out + 1))

    def _bucket_top(self, tokens: int) -> int:
        edges = self.bucket_edges
        k = bucket_of(tokens, edges)
        if k + 1 < len(edges):
            return edges[k + 1]
        top = max(2 * edges[-1], 1)
        while top <= tokens:
            top *= 2
        return top

    def ttft_slack(self, r: SchedRequest, now: float) -> float:
        """Seconds to spare before the TTFT deadline once the rest of the prompt is prefilled."""
        left = r.num_prompt_tokens - r.num_computed_prompt_tokens
        prefill = self.cost.prefill_time([left]) if self.cost is not None and left > 0 else 0.0
        return r.arrival_time + self.slo_of(r)[0] - now - prefill

    @staticmethod
    def is_gt(r: SchedRequest) -> bool:
        """Whether `r` decodes: it has output and its KV holds all its sequence but the last token.

        A request re-prefilling after a recompute preemption has output but recomputes its prompt
        and output tokens first: prompt work, not a decode, until then (as the engines count it).
        """
        out = r.num_output_tokens
        return out > 0 and r.num_computed_tokens >= r.num_prompt_tokens + out - 1

    # -- interface -----------------------------------------------------------------------------

    def order_waiting(self, waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        now = ctx.now

        def key(r: R) -> tuple[int, int, float, int, float, IdKey]:
            if r.num_output_tokens > 0:  # a preempted GT: TTFT is behind it, its TPOT is at stake
                return (0, 0, 0.0, 0, r.arrival_time, id_key(r.req_id))
            slack = self.ttft_slack(r, now)
            if slack < 0:
                return (2, 0, 0.0, 0, r.arrival_time, id_key(r.req_id))
            # The bucket whose top predicted_output is: that top is the next bucket's lower edge, and
            # past the last edge every top reads as the last bucket, which merged the last two.
            bucket = bucket_of(self.predicted_output(r) - 1, self.bucket_edges)
            return (1, bucket, slack, r.num_prompt_tokens, r.arrival_time, id_key(r.req_id))

        return sorted(waiting, key=key)

    def order_running(self, running: Sequence[R], ctx: SchedContext) -> list[R]:
        # Requests re-prefilling after a recompute preemption are PTs: counted as GTs, their
        # contexts inflated the decode time that time-synced batching caps the prefill chunk by.
        gts = [r for r in running if self.is_gt(r)]
        pts = [r for r in running if not self.is_gt(r)]
        gts.sort(key=lambda r: (-(r.num_prompt_tokens + r.num_output_tokens), r.admission_seq))

        def pt_key(r: R) -> tuple[bool, bool, float, int]:
            if r.num_output_tokens > 0:  # re-prefilling: its TTFT is behind it, first as when waiting
                return (False, False, 0.0, r.admission_seq)
            slack = self.ttft_slack(r, ctx.now)
            return (True, slack < 0, slack, r.admission_seq)

        pts.sort(key=pt_key)
        self._decode_ctx = [r.num_prompt_tokens + r.num_output_tokens for r in gts]
        self._tpot_now = min((self.slo_of(r)[1] for r in gts), default=self.tpot_slo_s)
        return [*gts, *pts]

    def prefill_token_cap(self, ctx: SchedContext, num_decodes: int) -> int:
        if self.cost is None or num_decodes == 0 or not self._decode_ctx:
            return ctx.token_budget
        p = self.cost.prefill
        spare = (
            self.sync_factor * self._tpot_now
            - self.cost.decode_time(self._decode_ctx)
            + min(p.a, self.cost.decode.a)
            - p.a
        )
        if spare <= 0:
            return 0
        # Largest x with b x + c x^2 <= spare.
        x = spare / p.b if p.c == 0 else (-p.b + (p.b * p.b + 4 * p.c * spare) ** 0.5) / (2 * p.c)
        return int(min(ctx.token_budget, max(0.0, x)))

    def admission_limit(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> int | None:
        n_ok = len(waiting)
        if self.cost is not None:
            n_ok = min(n_ok, self._batch_room(running, waiting))
        if self.reserve and self._has_predictions(running, waiting):
            n_ok = min(n_ok, self._kv_room(running, waiting, ctx))
        if self.late_kv_share < 1:
            n_ok = min(n_ok, self._late_room(running, waiting, ctx))
        if running:
            return max(0, n_ok)
        # An idle engine is gated too (a burst must not overcommit the cache), but it must make
        # progress: one admission at least, even of a request larger than the whole target.
        return None if n_ok >= len(waiting) else max(1, n_ok)

    # -- admission helpers ---------------------------------------------------------------------

    def _has_predictions(self, running: Sequence[R], waiting: Sequence[R]) -> bool:
        # Reservation needs predicted lengths; with none, allocate on demand like vLLM.
        if self.default_prediction is not None:
            return True
        return any(r.predicted_output_tokens is not None for rs in (running, waiting) for r in rs)

    def _batch_room(self, running: Sequence[R], waiting: Sequence[R]) -> int:
        """How many of `waiting` can join before a decode-only iteration exceeds its TPOT share."""
        assert self.cost is not None
        d = self.cost.decode
        tpot = min((self.slo_of(r)[1] for r in running), default=self.tpot_slo_s)
        total = sum(r.num_prompt_tokens + r.num_output_tokens for r in running)
        n = len(running)
        for k, r in enumerate(waiting):
            total += r.num_prompt_tokens + r.num_output_tokens
            n += 1
            tpot = min(tpot, self.slo_of(r)[1])
            limit = tpot * self.decode_share
            if d.a + d.b * total + d.c * n > limit:
                return k
        return len(waiting)

    def _late_room(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> int:
        """How many of `waiting` to admit before a late request would push KV past `late_kv_share`.

        Counted in whole blocks, as the engine allocates (and as `_kv_room` counts): in tokens, each
        request's last partial block was missed, so a late request got in over the share.
        """
        cap = self.late_kv_share * ctx.total_kv_blocks
        bs = ctx.block_size
        used = sum(-(-(r.num_prompt_tokens + r.num_output_tokens) // bs) for r in running)
        for k, r in enumerate(waiting):
            late = r.num_output_tokens == 0 and self.ttft_slack(r, ctx.now) < 0
            if late and used + -(-(r.num_prompt_tokens + self.predicted_output(r)) // bs) > cap:
                return k
            used += -(-(r.num_prompt_tokens + r.num_output_tokens) // bs)
        return len(waiting)

    def _kv_room(self, running: Sequence[R], waiting: Sequence[R], ctx: SchedContext) -> int:
        """How many of `waiting` fit under the KV reservation (with pipelining if enabled).

        The peak only grows as requests join (each adds non-negative occupancy and one more time
        point), so the first waiting request that pushes it over the cap is found by bisection:
        checking every prefix in turn made an iteration cubic in the queue length (a 60 s run at
        50 req/s did not finish in minutes). Token counts are integers, so the sums are exact and
        the answer is the same.
        """
        bs = ctx.block_size
        cap = self.kv_target * ctx.total_kv_blocks * bs
        both = [*running, *waiting]
        held = [r.num_prompt_tokens + r.num_output_tokens for r in both]
        steps = [self.predicted_output(r) - r.num_output_tokens for r in both]
        n = len(running)
        lo, hi = 0, len(waiting)  # the answer lies in [lo, hi]
        while lo < hi:
            k = (lo + hi) // 2
            if _peak_tokens(held[: n + k + 1], steps[: n + k + 1], self.pipelining, bs) > cap:
                hi = k
            else:
                lo = k + 1
        return lo


def _peak_tokens(held: list[int], steps: list[int], pipelining: bool, block_size: int = 1) -> float:
    """Peak KV tokens of requests holding held[i] now and growing for steps[i] more iterations.

    Without pipelining every reservation counts in full (held + steps). With it, occupancy at
    iteration t is the sum over requests still running (t < steps[i]) of held[i] + t; it peaks just
    before some request finishes, at t = steps[i] - 1, which are the only points evaluated. KV is
    allocated in blocks, so each request's tokens count rounded up to whole `block_size` blocks
    (counted in tokens, the last partial block of every request was missed: reservations that
    fit in tokens overran the cache by up to a block per request, and the engine preempted).
    Rounding keeps each request's occupancy non-decreasing in t, so the peak points are the same.
    """
    h = np.asarray(held, dtype=float)
    s = np.asarray(steps, dtype=float)
    if not pipelining:
        return float((np.ceil((h + s) / block_size) * block_size).sum())
    t = np.unique(s - 1.0)
    alive = s[None, :] > t[:, None]  # [time point, request]
    occ = (alive * (np.ceil((h[None, :] + t[:, None]) / block_size) * block_size)).sum(axis=1)
    return float(occ.max())
