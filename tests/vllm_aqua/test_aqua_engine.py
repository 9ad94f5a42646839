"""Aqua on the real vLLM CPU engine: offload-on-preemption is exact, saves recompute, survives a
reclaim, and the comparison would notice a corrupted restore."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from tests.vllm_aqua import engines
from tests.vllm_aqua.conftest import MAX_TOKENS, PROMPTS, AquaEngine, Lender

pytestmark = pytest.mark.vllm

# Batch composition changes the floating-point reduction order a little; KV errors move
# logprobs by whole units (see the sensitivity test).
LOGPROB_TOL = 1e-3


def _run(engine: AquaEngine) -> tuple[list[engines.Completion], dict[str, int], dict[str, int]]:
    s0, w0 = engine.sched(), engine.worker()
    out = engines.generate(engine.llm, PROMPTS, MAX_TOKENS)
    return out, engines.delta(engine.sched(), s0), engines.delta(engine.worker(), w0)


def test_it_gives_identical_greedy_outputs_under_many_preemptions(
    aqua: AquaEngine, reference: list[engines.Completion]
) -> None:
    out, sched, worker = _run(aqua)
    assert sched["preemptions"] >= 10, sched
    assert worker["loads"] >= 5 and worker["load_failures"] == 0, worker
    assert worker["bytes_restored"] > 0 and worker["bytes_offloaded"] >= worker["bytes_restored"]
    assert aqua.worker()["saves_by_tier"].get("lent", 0) > 0, "the lent region was never used"
    for got, want in zip(out, reference, strict=True):
        assert got.token_ids == want.token_ids
    assert engines.max_logprob_diff(out, reference) <= LOGPROB_TOL


def test_it_restores_instead_of_recomputing(aqua: AquaEngine, recompute: AquaEngine) -> None:
    out_with, with_conn, _ = _run(aqua)
    out_without, without, _ = _run(recompute)
    assert with_conn["preemptions"] > 0 and without["preemptions"] > 0
    # Without the connector every preempted token's KV is computed again.
    assert without["recomputed_tokens"] >= 20 * without["preemptions"], without
    assert with_conn["recomputed_tokens"] <= 0.05 * without["recomputed_tokens"], (with_conn, without)
    # Both are still exact (recompute is vLLM's own path).
    assert [c.token_ids for c in out_with] == [c.token_ids for c in out_without]


def test_it_detects_a_corrupted_restored_block(aqua: AquaEngine, reference: list[engines.Completion]) -> None:
    aqua.corrupt_file.touch()
    try:
        out, _, worker = _run(aqua)
    finally:
        aqua.corrupt_file.unlink()
    assert worker["corrupted_restores"] > 0
    assert engines.max_logprob_diff(out, reference) > LOGPROB_TOL


def test_it_frees_the_buffer_of_a_request_aborted_while_offloaded(aqua: AquaEngine, wait_for: Any) -> None:
    # A client disconnect aborts requests in vLLM's engine core. The buffer of one aborted while
    # preempted is freed by the step that reports the abort, though no request is left to step for.
    from vllm import SamplingParams

    engine = aqua.llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    held = lambda: sum(aqua.worker(0).get("held", {}).values())  # noqa: E731
    dropped = 0
    for attempt in range(3):  # until an abort hits an offloaded request (the counters lag a little)
        before = engines.counters(aqua.stats, "offload-scheduler.json")
        ids = [engine.add_request(f"abort{attempt}-{i}", p, params) for i, p in enumerate(PROMPTS)]
        while engine.has_unfinished_requests() and held() == 0:
            engine.step()
        engine.abort_request(ids, internal=True)
        assert wait_for(lambda: held() == 0, timeout=30), aqua.worker(0)
        after = engines.counters(aqua.stats, "offload-scheduler.json")
        dropped = after["offloads_dropped"] - before.get("offloads_dropped", 0)
        if dropped:
            break
    assert dropped > 0, "no abort hit an offloaded request"
    assert held() == 0


def test_it_survives_a_reclaim_mid_run(
    aqua: AquaEngine, lender: Lender, reference: list[engines.Completion], wait_for: Any
) -> None:
    result: dict[str, Any] = {}
    before = aqua.worker()

    def run() -> None:
        result["out"] = engines.generate(aqua.llm, PROMPTS, MAX_TOKENS)

    t = threading.Thread(target=run)
    t.start()
    # Reclaim while the lent region holds offloaded KV.
    held = wait_for(lambda: aqua.worker(0).get("held", {}).get("lent", 0) > 0, timeout=120, interval=0.01)
    os.kill(lender.producer.pid, signal.SIGUSR1)
    t.join(timeout=300)
    assert not t.is_alive()
    events = [lender.next_event(), lender.next_event()]
    assert [e["event"] for e in events] == ["reclaiming", "reclaimed"], events
    assert events[1]["clean"] is True
    assert lender.producer.wait(30) == 0
    after = aqua.worker()
    assert held, "no offload was ever held in the lent region"
    assert after["evacuations"] > before.get("evacuations", 0) or after["held"].get("lent", 0) == 0
    assert engines.max_logprob_diff(result["out"], reference) <= LOGPROB_TOL
