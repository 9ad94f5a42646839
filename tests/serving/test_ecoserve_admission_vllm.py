"""EcoServe on vLLM 0.32's real scheduler (no model), as an operator's traffic reaches it: a burst
arriving at an idle engine, and per-request hints a client may get wrong (docs/ecoserve-vllm.md)."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("vllm")

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.bare_scheduler import make_request, step

NUM_BLOCKS = 16  # 512 tokens
PROMPT, OUTPUT = 32, 100  # each reserves 32 + 100 (its max_tokens, below the bucket top 128): three fit
OPTIONS: dict[str, float] = {"ttft_slo_s": 100.0, "tpot_slo_s": 10.0, "late_kv_share": 1.0}
ECOSERVE: dict[str, Any] = {"aqua_policy": "ecoserve", "aqua_policy_options": OPTIONS}


def scheduler() -> Any:
    from serving.vllm_ext.scheduler import AquaScheduler

    return bare_scheduler.make_scheduler(
        AquaScheduler, max_num_seqs=8, num_blocks=NUM_BLOCKS, additional=ECOSERVE
    )


def drain(s: Any, produced: dict[str, int]) -> None:
    for _ in range(3000):
        if not s.requests:
            return
        step(s, produced)
    raise AssertionError("requests left unfinished")


def test_a_burst_at_an_idle_engine_is_gated_by_the_reservation() -> None:
    s = scheduler()
    for name in "abcdef":
        extra = {"predicted_output_tokens": OUTPUT}
        s.add_request(make_request(name, PROMPT, OUTPUT, time.time(), extra_args=extra))
    produced: dict[str, int] = {}
    admitted = {r.req_id for r in step(s, produced).scheduled_new_reqs}
    assert len(admitted) == 3  # what the reservation fits, not all six
    drain(s, produced)
    assert s.counters["preemptions"] == 0
    assert produced == dict.fromkeys("abcdef", OUTPUT)


def test_an_idle_engine_still_admits_a_request_larger_than_the_cache_target() -> None:
    from serving.vllm_ext.scheduler import AquaScheduler

    options = {**OPTIONS, "kv_target": 0.1}  # 51 tokens: no request fits
    s = bare_scheduler.make_scheduler(
        AquaScheduler,
        max_num_seqs=8,
        num_blocks=NUM_BLOCKS,
        additional={"aqua_policy": "ecoserve", "aqua_policy_options": options},
    )
    for name in "ab":
        s.add_request(
            make_request(name, PROMPT, OUTPUT, time.time(), extra_args={"predicted_output_tokens": 100})
        )
    produced: dict[str, int] = {}
    assert len(step(s, produced).scheduled_new_reqs) == 1  # progress, one at a time
    drain(s, produced)
    assert produced == {"a": OUTPUT, "b": OUTPUT}


def test_a_prediction_beyond_max_tokens_counts_as_max_tokens() -> None:
    from serving.policies.ecoserve import EcoServePolicy
    from serving.vllm_ext.request_view import VllmRequestView

    def reserved(prediction: Any, max_tokens: int = 20) -> int:
        extra = {"predicted_output_tokens": prediction}
        view = VllmRequestView(make_request("r", 8, max_tokens, 0.0, extra_args=extra), 0)
        assert view.max_output_tokens == max_tokens
        return EcoServePolicy(bucket_edges=(0, 16, 32, 64)).predicted_output(view)

    assert reserved(10**9) == 20  # what it may generate, not a billion (nor its bucket's top, 32)
    assert reserved(1e30) == 20
    assert reserved(12) == 16
    assert reserved(10**9, max_tokens=200) == 200
    # The scheduler's views know max_model_len (512 here): a 500-token prompt leaves room for 12.
    s = scheduler()
    s.add_request(make_request("long", 500, 100, 0.0, extra_args={"predicted_output_tokens": 100}))
    assert s._order_waiting(s._context())[0].max_output_tokens == 12
    assert s._view(s.requests["long"]).max_output_tokens == 12


def test_a_huge_prediction_does_not_hold_back_everyone_else() -> None:
    """One client's request with an absurd prediction (the gateway passes any integer through)
    must not stop the engine admitting other requests while it runs."""
    s = scheduler()
    produced: dict[str, int] = {}
    huge = {"predicted_output_tokens": 10**9}
    s.add_request(make_request("big", PROMPT, 150, time.time(), extra_args=huge))
    step(s, produced)
    for name in "xyz":
        s.add_request(make_request(name, PROMPT, 20, time.time()))
    admitted = {r.req_id for r in step(s, produced).scheduled_new_reqs}
    assert admitted == {"x", "y", "z"}
    drain(s, produced)
    assert produced == {"big": 150, "x": 20, "y": 20, "z": 20}
