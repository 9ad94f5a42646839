"""First-come-first-served: vLLM's default, the baseline every other policy is compared with."""

from __future__ import annotations

from collections.abc import Sequence

from serving.policies.base import R, SchedContext, SchedulingPolicy, id_key
from serving.policies.registry import register_policy


@register_policy("fcfs")
class FCFSPolicy(SchedulingPolicy):
    """Admit by arrival; serve in admission order, so the latest admitted is preempted first."""

    # Neither order depends on time or token counts, and it never rotates: the simulator may run
    # identical decode-only iterations without consulting it (see serving/sim/fastforward.py).
    decode_invariant = True

    def order_waiting(self, waiting: Sequence[R], ctx: SchedContext) -> list[R]:
        # Preempted requests keep their original arrival time and so go back to the front.
        return sorted(waiting, key=lambda r: (r.arrival_time, id_key(r.req_id)))

    def order_running(self, running: Sequence[R], ctx: SchedContext) -> list[R]:
        return sorted(running, key=lambda r: r.admission_seq)
