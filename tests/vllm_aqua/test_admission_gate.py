"""AquaScheduler on vLLM 0.32's real scheduler (no model): per-request hints from
SamplingParams.extra_args, and a policy's admission limit (EcoServe's KV reservation)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.bare_scheduler import make_request, step

NUM_BLOCKS = 16  # 512 tokens
PROMPT, OUTPUT = 32, 100  # 132 tokens: 5 blocks each at the end; 3 fit, 6 do not
# Only the KV reservation gates: no cost model (no batch cap) and no late-request gate.
ECOSERVE = {
    "aqua_policy": "ecoserve",
    "aqua_policy_options": {"ttft_slo_s": 100.0, "tpot_slo_s": 10.0, "late_kv_share": 1.0},
}


def scheduler() -> Any:
    from serving.vllm_ext.scheduler import AquaScheduler

    return bare_scheduler.make_scheduler(
        AquaScheduler, max_num_seqs=8, num_blocks=NUM_BLOCKS, additional=ECOSERVE
    )


def add(s: Any, names: list[str], predict: bool) -> None:
    extra = {"predicted_output_tokens": OUTPUT} if predict else None
    for name in names:
        s.add_request(make_request(name, PROMPT, OUTPUT, time.time(), extra_args=extra))


def run_two_then_four(predict: bool) -> tuple[Any, set[str], dict[str, int]]:
    """Two requests start; four more arrive. Returns the scheduler, the ids admitted in the step
    after the arrival, and how many tokens each request delivered by the end."""
    s = scheduler()
    produced: dict[str, int] = {}
    add(s, ["a", "b"], predict)
    step(s, produced)
    add(s, ["c", "d", "e", "f"], predict)
    admitted = {r.req_id for r in step(s, produced).scheduled_new_reqs}
    for _ in range(2000):
        if not s.requests:
            break
        step(s, produced)
    return s, admitted, produced


def test_the_view_reads_predictions_and_slo_classes_from_extra_args() -> None:
    from serving.vllm_ext.request_view import VllmRequestView

    def view(extra: dict[str, Any] | None) -> VllmRequestView:
        return VllmRequestView(make_request("r", 8, 4, 0.0, extra_args=extra), 0)

    hinted = view({"predicted_output_tokens": 120, "slo_class": "chat"})
    assert (hinted.predicted_output_tokens, hinted.slo_class) == (120, "chat")
    assert view({"predicted_output_tokens": 120.0}).predicted_output_tokens == 120
    assert (view(None).predicted_output_tokens, view(None).slo_class) == (None, None)
    for bad in ("120", 0, -3, 12.5, True, None, [120]):
        assert view({"predicted_output_tokens": bad}).predicted_output_tokens is None
    for bad in ("", 5, None):
        assert view({"slo_class": bad}).slo_class is None


def test_ecoserve_holds_back_what_the_reservation_cannot_fit_and_avoids_preemption() -> None:
    s, admitted, produced = run_two_then_four(predict=True)
    # Two running reserve 2 x (32 + 100, their max_tokens); one more fits in 512 tokens, two do not.
    assert admitted == {"c"}
    assert s.counters["held_back"] >= 3
    assert s.counters["preemptions"] == 0
    assert produced == dict.fromkeys("abcdef", OUTPUT)  # every request finished, none lost


def test_without_predictions_vllm_admits_on_demand_and_preempts() -> None:
    s, admitted, produced = run_two_then_four(predict=False)
    assert admitted == {"c", "d", "e", "f"}
    assert s.counters["held_back"] == 0
    assert s.counters["preemptions"] > 0
    assert produced == dict.fromkeys("abcdef", OUTPUT)


@pytest.mark.parametrize("policy", ["aqua", "fcfs"])
def test_policies_without_an_admission_limit_are_not_gated(policy: str) -> None:
    from serving.vllm_ext.scheduler import AquaScheduler

    s = bare_scheduler.make_scheduler(
        AquaScheduler, max_num_seqs=8, num_blocks=NUM_BLOCKS, additional={"aqua_policy": policy}
    )
    add(s, ["a", "b"], predict=True)
    step(s)
    add(s, ["c", "d", "e", "f"], predict=True)
    assert {r.req_id for r in step(s).scheduled_new_reqs} == {"c", "d", "e", "f"}
    assert s.counters["held_back"] == 0
