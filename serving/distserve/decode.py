"""A decode-only instance (one lane) of a disaggregated deployment, with pull-based KV transfer.

Requests arrive when their prefill is done (the first token was emitted by a prefill instance) and
their KV cache waits there. The decode lane pulls a request when it has room: a free sequence slot
and KV blocks for the request's whole final sequence (prompt + all output tokens; DistServe's decode
instances know max_tokens, and reserving it means a pulled request is never preempted). Pulls go in
ready order over the lane's one link, one at a time: a pull starts when the link is free and takes
`link.seconds(prompt KV bytes)`; the request joins the running batch at the first iteration that
starts after its KV has landed. Transfers overlap with decoding (they do not lengthen iterations).

Each iteration decodes one token for every running request and lasts
`CostModel.decode_time(context lengths)`; a request finishes with its last token and frees its
blocks at the end of that iteration.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from serving.costmodel import CostModel, Link
from serving.metrics.records import RequestRecord


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
        self, cost: CostModel, kv_tokens: int, link: Link, block_size: int = 16, max_num_seqs: int = 256
    ) -> None:
        if kv_tokens < block_size:
            raise ValueError(f"{kv_tokens=} must hold at least one block of {block_size}")
        if max_num_seqs < 1:
            raise ValueError(f"{max_num_seqs=} must be positive")
        self.cost = cost
        self.link = link
        self.block_size = block_size
        self.free_blocks = kv_tokens // block_size
        self.max_num_seqs = max_num_seqs
        self.transfer_seconds = 0.0
        self.iterations = 0

    def _blocks(self, r: RequestRecord) -> int:
        return -(-(r.prompt_tokens + r.output_tokens) // self.block_size)

    def run(self, handoffs: list[Handoff]) -> None:
        """Decode every handed-off request to completion (appending to their records)."""
        for h in handoffs:
            if self._blocks(h.record) > self.free_blocks:
                raise ValueError(f"request {h.record.req_id} can never fit this decode lane's KV cache")
        queue = deque(
            sorted(
                (h for h in handoffs if h.record.output_tokens > 1), key=lambda h: (h.ready, h.record.req_id)
            )
        )
        landing: list[tuple[float, int, RequestRecord]] = []  # heap of (KV landed, req_id, record)
        # Every running request gets a token at the end of every iteration, so a request's tokens
        # are the end times of a run of consecutive iterations: record the iteration end times
        # once and, per request, where its run starts and ends (O(1) work per iteration, not O(batch)).
        ends: list[float] = []  # end time of every iteration
        finishing: dict[int, list[RequestRecord]] = {}  # iteration index -> requests it finishes
        spans: list[tuple[RequestRecord, int, int]] = []  # (record, first iteration, tokens to add)
        n_running = 0
        ctx_total = 0  # sum of running requests' context lengths
        link_free = 0.0
        slots = self.max_num_seqs
        now = 0.0
        d = self.cost.decode
        while queue or landing or n_running:
            # Pull while there is room: slot and blocks are taken when the pull starts.
            while (
                queue
                and queue[0].ready <= now
                and slots > 0
                and self._blocks(queue[0].record) <= self.free_blocks
            ):
                h = queue.popleft()
                nbytes = h.record.prompt_tokens * self.cost.kv_bytes_per_token
                start = max(link_free, now)  # pulled at this scheduling point
                seconds = self.link.seconds(nbytes)
                link_free = start + seconds
                self.transfer_seconds += seconds
                self.free_blocks -= self._blocks(h.record)
                slots -= 1
                heapq.heappush(landing, (link_free, h.record.req_id, h.record))
            while landing and landing[0][0] <= now:
                _, _, rec = heapq.heappop(landing)
                have = len(rec.token_times)
                rest = rec.output_tokens - have
                first = len(ends)
                spans.append((rec, first, rest))
                finishing.setdefault(first + rest - 1, []).append(rec)
                n_running += 1
                ctx_total += rec.prompt_tokens + have
            if not n_running:
                # Idle until a pull lands or the next request is ready. A ready request left in
                # the queue is waiting for blocks that in-flight pulls hold: only a landing helps.
                head = queue[0].ready if queue and slots > 0 else float("inf")
                nxt = min(landing[0][0] if landing else float("inf"), head if head > now else float("inf"))
                if nxt == float("inf"):
                    raise RuntimeError("decode lane stalled: requests wait but nothing can run or land")
                now = max(now, nxt)
                continue
            now = now + (d.a + d.b * ctx_total + d.c * n_running)
            done = finishing.pop(len(ends), ())
            ends.append(now)
            self.iterations += 1
            for rec in done:
                self.free_blocks += self._blocks(rec)
                slots += 1
                ctx_total -= rec.prompt_tokens + rec.output_tokens - 1
            n_running -= len(done)
            ctx_total += n_running
        for rec, first, rest in spans:
            rec.token_times.extend(ends[first : first + rest])
