"""A prefill-only instance (one lane) of a disaggregated deployment that holds KV until it is pulled.

DistServe (OSDI'24, Sec. 4.3) transfers KV pull-based: a prefilled request's KV stays in the prefill
instance's GPU memory, which is the queueing buffer, until a decode instance with room fetches it.
Here the lane is an FCFS `EngineSim` (vLLM V1 scheduling, chunked prefill up to the token budget)
serving each request's prompt and emitting its first token. A request with tokens left to decode
then keeps its prompt's KV blocks (`held`) until `release` says when its pull lands; held blocks
count against the lane's KV cache like a running request's, so a lane full of un-pulled KV admits
no new prompt (and may preempt a part-prefilled one) until pulls land. A request that ends at its
first token frees its blocks at once, as in the engine.

The lane is advanced by a co-simulation (serving/distserve/disagg.py) one scheduling point at a
time: `next_time` says when (inf while only a release can give it work), `step` runs it: the
releases and arrivals due by then are applied, then one engine iteration (`EngineSim.step`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from serving.costmodel import CostModel
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.sim.state import FINISHED, REJECTED, SimRequest
from serving.workload.request import Request


class PrefillLaneSim:
    """One prefill lane, stepped in time; prefilled requests hold their KV until released.

    Attributes:
        engine: The engine serving the prompts (each request asks it for one token).
        records: One record per request, in arrival order; each keeps its full `output_tokens`
            (decode appends the tokens after the first). A rejected request's has no tokens.
    """

    def __init__(self, cost: CostModel, config: EngineConfig, requests: Sequence[Request]) -> None:
        self.engine = EngineSim(cost, config, get_policy("fcfs"))
        self._arrivals: list[SimRequest] = []  # arrival order
        for r in sorted(requests, key=lambda r: (r.arrival, r.req_id)):
            sim = SimRequest(Request(r.req_id, r.arrival, r.prompt_tokens, 1, r.slo_class))
            sim.record.output_tokens = r.output_tokens  # the engine reads target_output_tokens (1)
            self._arrivals.append(sim)
        self.records = [s.record for s in self._arrivals]
        self._next = 0  # index of the next arrival
        self._held: dict[int, int] = {}  # req_id -> blocks its KV holds, until its release is known
        self._releases: list[tuple[float, int, int]] = []  # heap of (pull landed, req_id, blocks)
        self._blocked = False  # the last step scheduled nothing: wait for an arrival or a release

    @property
    def held_blocks(self) -> int:
        """Blocks held by prefilled requests whose KV has not been freed yet."""
        return sum(self._held.values()) + sum(b for _, _, b in self._releases)

    @property
    def pending(self) -> bool:
        """Whether requests are yet to arrive, queued, prefilling, or holding KV."""
        eng = self.engine
        return bool(self._next < len(self._arrivals) or eng.running or eng.waiting or self.held_blocks)

    def release(self, req_id: int, at: float) -> None:
        """Free the KV held for `req_id` at time `at` (when its pull lands at the decode side).

        Raises:
            ValueError: The lane holds no KV for `req_id` (never prefilled here, or released twice).
        """
        if req_id not in self._held:
            raise ValueError(f"request {req_id} holds no KV on this prefill lane")
        heapq.heappush(self._releases, (at, req_id, self._held.pop(req_id)))

    def next_time(self) -> float:
        """Time of the lane's next scheduling point; inf while nothing is due and no release is known."""
        eng = self.engine
        if (eng.running or eng.waiting) and not self._blocked:
            return eng.now
        inf = float("inf")
        arrival = self._arrivals[self._next].arrival_time if self._next < len(self._arrivals) else inf
        nxt = min(arrival, self._releases[0][0] if self._releases else inf)
        return max(eng.now, nxt)

    def step(self) -> list[RequestRecord]:
        """Run the scheduling point at `next_time()`.

        Returns:
            The records of the requests whose prefill ended in its iteration (their first token's
            time is its end); those with tokens left to decode now hold their KV.
        """
        eng = self.engine
        kv = eng.kv
        now = eng.now = self.next_time()
        while self._releases and self._releases[0][0] <= now:
            kv.release(heapq.heappop(self._releases)[2])
        arrivals = self._arrivals
        while self._next < len(arrivals) and arrivals[self._next].arrival_time <= now:
            r = arrivals[self._next]
            self._next += 1
            if r.num_prompt_tokens > kv.total * kv.block_size:  # as in EngineSim.run: it never fits
                r.state = REJECTED
                eng.stats.rejected += 1
            else:
                eng.waiting.append(r)
        if not eng.running and not eng.waiting:
            return []
        before = eng.running + eng.waiting
        progressed, _ = eng.step()
        self._blocked = not progressed
        done = [r for r in before if r.state == FINISHED]
        for r in done:
            if r.record.output_tokens > 1:
                # The engine freed the request's blocks at its first token: take them back.
                held = kv.try_allocate(0, r.num_prompt_tokens)
                if held < 0:
                    raise RuntimeError(f"request {r.req_id}'s freed KV blocks are gone")
                self._held[r.req_id] = held
        return [r.record for r in done]
