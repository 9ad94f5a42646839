"""The Aqua scheduler under KV pressure: a step that rotates requests out admits a waiting one."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import AQUA_SCHEDULER


def test_every_step_that_rotates_admits_a_waiting_request() -> None:
    # Regression: the policy counted a decoding victim's KV as one token more than vLLM holds for it
    # (its last sampled token has no KV yet) and ignored the blocks and tokens the requests left
    # running take in the same step, so vLLM preempted victims (a recompute or a KV copy each) and
    # then could not admit anyone: 15 of 229 rotating steps in this workload.
    from vllm.utils.import_utils import resolve_obj_by_qualname

    s = bare_scheduler.make_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER), max_num_seqs=8, num_blocks=24, max_num_batched_tokens=128
    )
    rotating_steps = idle = 0
    for rotated, admitted, _ in _random_arrivals(s):
        rotating_steps += rotated
        idle += rotated and not admitted
    assert rotating_steps > 100  # the workload does put the policy under pressure
    assert idle == 0, (idle, rotating_steps)


def test_with_prefix_caching_every_step_that_rotates_admits_a_waiting_request() -> None:
    # Regression: with prefix caching, requests that share a system prompt share its KV blocks, and
    # preempting one frees only the blocks no running request still references; the policy counted
    # all of a victim's blocks, so vLLM preempted victims and then could not admit anyone (13 of 242
    # rotating steps in this workload).
    from vllm.utils.import_utils import resolve_obj_by_qualname

    s = bare_scheduler.make_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER),
        max_num_seqs=8,
        num_blocks=24,
        max_num_batched_tokens=128,
        enable_prefix_caching=True,
    )
    hasher = bare_scheduler.prefix_block_hasher()
    rotating_steps = idle = shared_hits = 0
    for seed in range(6):
        rng = random.Random(seed)
        system_prompt = [rng.randint(1, 500) for _ in range(160)]  # 5 blocks of 32 tokens
        # (arrival step, own prompt tokens, output tokens, whether the prompt starts with the system
        # prompt); 24 blocks hold about 5 requests' KV, or more of those that share it.
        pending = sorted(
            (rng.randint(0, 60), rng.randint(8, 150), rng.randint(2, 150), rng.random() < 0.5)
            for _ in range(30)
        )
        step = 0
        while pending or s.has_requests():
            while pending and pending[0][0] <= step:
                _, own, output, shared = pending.pop(0)
                prompt = (system_prompt if shared else []) + [rng.randint(1, 500) for _ in range(own)]
                req = bare_scheduler.make_request(
                    f"{seed}-{len(pending)}",
                    len(prompt),
                    output,
                    float(step),
                    prefix=prompt,
                    block_hasher=hasher,
                )
                s.add_request(req)
            rotated, admitted, out = _step(s)
            shared_hits += sum(nr.num_computed_tokens >= len(system_prompt) for nr in out.scheduled_new_reqs)
            rotating_steps += rotated
            idle += rotated and not admitted
            step += 1
    assert rotating_steps > 100  # the workload does put the policy under pressure
    assert shared_hits > 30  # and requests do share the system prompt's blocks
    assert idle == 0, (idle, rotating_steps)


def _random_arrivals(s: Any) -> Iterator[tuple[bool, int, Any]]:
    """Six seeds of 30 random requests arriving over 60 steps, run to the end: each step's `_step`.

    The caller's loop body runs before the next step (and its arrivals)."""
    for seed in range(6):
        rng = random.Random(seed)
        # (arrival step, prompt tokens, output tokens); 24 blocks of 32 tokens hold about 5 of them.
        pending = sorted((rng.randint(0, 60), rng.randint(8, 150), rng.randint(2, 150)) for _ in range(30))
        step = 0
        while pending or s.has_requests():
            while pending and pending[0][0] <= step:
                _, prompt, output = pending.pop(0)
                rid = f"{seed}-{len(pending)}"
                s.add_request(bare_scheduler.make_request(rid, prompt, output, arrival_time=float(step)))
            yield _step(s)
            step += 1


def _step(s: Any) -> tuple[bool, int, Any]:
    """One scheduler step: whether it rotated requests out, how many it admitted, its output."""
    rotations = s.counters["rotations"]
    out = bare_scheduler.step(s)
    admitted = len(out.scheduled_new_reqs) + len(out.scheduled_cached_reqs.resumed_req_ids)
    return s.counters["rotations"] > rotations, admitted, out


def test_with_speculative_decoding_every_step_that_rotates_admits_a_waiting_request() -> None:
    # Regression: the policy counted one token for a decode, but vLLM also schedules its draft
    # tokens and allocates their KV before admitting anyone: the staying decodes took the blocks a
    # rotation freed and the waiting request was not admitted (4 of 479 rotating steps here).
    from vllm.utils.import_utils import resolve_obj_by_qualname

    drafts = 4
    s = bare_scheduler.make_speculative_scheduler(
        resolve_obj_by_qualname(AQUA_SCHEDULER), drafts=drafts, num_blocks=24
    )
    rotating_steps = idle = drafted = 0
    for rotated, admitted, out in _random_arrivals(s):
        rotating_steps += rotated
        idle += rotated and not admitted
        drafted += len(out.scheduled_spec_decode_tokens)
        # The drafter proposes `drafts` tokens for every decode (the model runner rejects them all).
        bare_scheduler.propose_drafts(s, drafts)
    assert rotating_steps > 100 and drafted > 1000  # pressure, and decodes do carry drafts
    assert idle == 0, (idle, rotating_steps)
