"""A decode-only instance (one lane) of a disaggregated deployment, with pull-based KV transfer.

Requests are offered to the lane when their prefill is done (the first token was emitted by a
prefill instance), whose GPU memory holds their KV meanwhile. The decode lane pulls a request when it
has room: a free sequence slot and KV blocks for the request's whole final sequence (prompt + all
output tokens; DistServe's decode instances know max_tokens, and reserving it means a pulled request
is never preempted). Pulls go in ready order over the lane's one link, one at a time: a pull starts
when the link is free and takes `link.seconds(prompt KV bytes)`; when it starts, `on_pull` is told
when it will land (the prefill instance frees the request's KV then); the request joins the running
batch at the first iteration that starts after its KV has landed. Transfers overlap with decoding
(they do not lengthen iterations).

Each iteration decodes one token for every running request and lasts
`CostModel.decode_time(context lengths)`; a request finishes with its last token and frees its
blocks at the end of that iteration.

The lane runs alone (`run`: every handoff known up front) or stepped by a co-simulation
(serving/distserve/disagg.py): `offer` hands it a request, `next_time` says when its next scheduling
point is (an iteration boundary, a landing, or a ready request; inf while it waits for an offer),
`step` runs that scheduling point, and `finish` writes the decoded token times into the records.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from serving.costmodel import CostModel, Link
from serving.metrics.records import RequestRecord

# Told when a pull starts: (the pulled request's record, the time its KV lands at the decode lane).
PullHook = Callable[[RequestRecord, float], None]


@dataclass(slots=True)
class Handoff:
    """A request whose prefill is done, as the decode side sees it.

    Attributes:
        ready: Time its KV is complete at the prefill instance (its first token's time).
        record: Its record; token_times[0] is the first token, decode appends the rest.
    """

    ready: float
    record: RequestRecord


class DecodeLaneSim:
    """One decode lane: continuous batching of decode steps, pull-based admission."""

    def __init__(
        self,
        cost: CostModel,
        kv_tokens: int,
        link: Link,
        block_size: int = 16,
        max_num_seqs: int = 256,
        on_pull: PullHook | None = None,
    ) -> None:
        if kv_tokens < block_size:
            raise ValueError(f"{kv_tokens=} must hold at least one block of {block_size}")
        if max_num_seqs < 1:
            raise ValueError(f"{max_num_seqs=} must be positive")
        self.cost = cost
        self.link = link
        self.block_size = block_size
        self.total_blocks = kv_tokens // block_size
        self.free_blocks = self.total_blocks
        self.max_num_seqs = max_num_seqs
        self.on_pull = on_pull
        self.transfer_seconds = 0.0
        self.iterations = 0
        self.now = 0.0  # time of the pending scheduling point (or of the last one, while idle)
        self._due = True  # a scheduling point is pending at `now`
        self._queue: deque[Handoff] = deque()  # offered, not pulled, in (ready, req_id) order
        self._landing: list[tuple[float, int, RequestRecord]] = []  # heap of (KV landed, req_id, record)
        # Every running request gets a token at the end of every iteration, so a request's tokens
        # are the end times of a run of consecutive iterations: record the iteration end times
        # once and, per request, where its run starts and ends (O(1) work per iteration, not O(batch)).
        self._ends: list[float] = []  # end time of every iteration
        self._finishing: dict[int, list[RequestRecord]] = {}  # iteration index -> requests it finishes
        self._spans: list[tuple[RequestRecord, int, int]] = []  # (record, first iteration, tokens to add)
        self._n_running = 0
        self._ctx_total = 0  # sum of running requests' context lengths
        self._link_free = 0.0
        self._slots = max_num_seqs
        self._last_offer = (float("-inf"), -1)  # (ready, req_id) of the latest offer

    def _blocks(self, r: RequestRecord) -> int:
        return -(-(r.prompt_tokens + r.output_tokens) // self.block_size)

    def _check_fits(self, h: Handoff) -> None:
        if self._blocks(h.record) > self.total_blocks:
            raise ValueError(f"request {h.record.req_id} can never fit this decode lane's KV cache")

    @property
    def pending(self) -> bool:
        """Whether requests are queued, in flight or decoding."""
        return bool(self._queue or self._landing or self._n_running)

    def offer(self, h: Handoff) -> None:
        """Hand the lane a prefilled request; offers must come in (ready, req_id) order.

        Raises:
            ValueError: Its whole sequence could never fit the lane's KV cache, or it comes out of
                order.
        """
        self._check_fits(h)
        key = (h.ready, h.record.req_id)
        if key < self._last_offer:
            raise ValueError(f"request {h.record.req_id} offered out of (ready, req_id) order")
        self._last_offer = key
        if h.record.output_tokens > 1:  # (a request done at its first token needs no decode)
            self._queue.append(h)
            if h.ready <= self.now:
                self._due = True

    def next_time(self) -> float:
        """Time of the lane's next scheduling point; inf while only an offer can give it work."""
        if self._due:
            return self.now
        # Idle: until a pull lands or the next request is ready. A ready request left in the queue
        # is waiting for blocks that in-flight pulls hold: only a landing helps.
        inf = float("inf")
        head = self._queue[0].ready if self._queue and self._slots > 0 else inf
        return min(self._landing[0][0] if self._landing else inf, head if head > self.now else inf)

    def step(self) -> None:
        """Run the scheduling point at `next_time()`.

        Pulls that fit start, landed KV joins the batch, and one iteration runs if anything is
        running (the next scheduling point is then its end).
        """
        now = self.now = max(self.now, self.next_time())
        queue, landing = self._queue, self._landing
        # Pull while there is room: slot and blocks are taken when the pull starts.
        while (
            queue
            and queue[0].ready <= now
            and self._slots > 0
            and self._blocks(queue[0].record) <= self.free_blocks
        ):
            h = queue.popleft()
            nbytes = h.record.prompt_tokens * self.cost.kv_bytes_per_token
            start = max(self._link_free, now)  # pulled at this scheduling point
            seconds = self.link.seconds(nbytes)
            self._link_free = start + seconds
            self.transfer_seconds += seconds
            self.free_blocks -= self._blocks(h.record)
            self._slots -= 1
            heapq.heappush(landing, (self._link_free, h.record.req_id, h.record))
            if self.on_pull is not None:
                self.on_pull(h.record, self._link_free)
        ends = self._ends
        while landing and landing[0][0] <= now:
            _, _, rec = heapq.heappop(landing)
            have = len(rec.token_times)
            rest = rec.output_tokens - have
            first = len(ends)
            self._spans.append((rec, first, rest))
            self._finishing.setdefault(first + rest - 1, []).append(rec)
            self._n_running += 1
            self._ctx_total += rec.prompt_tokens + have
        n_running = self._n_running
        if not n_running:
            self._due = False
            return
        d = self.cost.decode
        now = self.now = now + (d.a + d.b * self._ctx_total + d.c * n_running)
        self._due = True  # the next scheduling point is the iteration's end
        done = self._finishing.pop(len(ends), ())
        ends.append(now)
        self.iterations += 1
        for rec in done:
            self.free_blocks += self._blocks(rec)
            self._slots += 1
            self._ctx_total -= rec.prompt_tokens + rec.output_tokens - 1
        self._n_running = n_running = n_running - len(done)
        self._ctx_total += n_running

    def finish(self) -> None:
        """Append every decoded request's tokens to its record (once the lane is done)."""
        ends = self._ends
        for rec, first, rest in self._spans:
            rec.token_times.extend(ends[first : first + rest])
        self._spans = []

    def run(self, handoffs: list[Handoff]) -> None:
        """Decode every handed-off request to completion (appending to their records)."""
        for h in handoffs:
            self._check_fits(h)
        for h in sorted(handoffs, key=lambda h: (h.ready, h.record.req_id)):
            self.offer(h)
        while self.pending:
            if self.next_time() == float("inf"):
                raise RuntimeError("decode lane stalled: requests wait but nothing can run or land")
            self.step()
        self.finish()
