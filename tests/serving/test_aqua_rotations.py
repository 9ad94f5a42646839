"""Aqua's rotations in the simulator: a preemption for fairness must let a waiting request in."""

from __future__ import annotations

import random

import pytest

from serving.policies import get_policy
from serving.policies.aqua import AquaFairPolicy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from serving.workload.request import Request
from tests.serving.conftest import constant_cost, make_cost, make_requests


class WatchedEngine(EngineSim):
    """Counts the steps whose rotations admitted no one (their preemptions bought nothing)."""

    rotation_steps = 0
    idle_rotation_steps = 0

    def step(self) -> tuple[bool, bool]:
        rotations, admissions = self.stats.rotations, self._admissions
        out = super().step()
        if self.stats.rotations > rotations:
            self.rotation_steps += 1
            self.idle_rotation_steps += self._admissions == admissions
        return out


@pytest.mark.parametrize("mode", ["recompute", "offload_dram"])
def test_it_admits_a_waiting_request_in_every_step_that_rotates(mode: str) -> None:
    # Regression: the policy counted a decoding victim's KV as one token more than it holds and
    # ignored the blocks the remaining running requests take in the same step (their decodes
    # crossing into a new block, their prefill chunks), so under KV pressure a rotation often
    # freed too little: the victim paid a save or a recompute and nobody was admitted.
    rotation_steps = 0
    for seed in range(12):
        rng = random.Random(seed)
        config = EngineConfig(
            max_num_batched_tokens=rng.choice([64, 128, 256]),
            max_num_seqs=rng.choice([4, 8, 16]),
            block_size=rng.choice([4, 8, 16]),
            num_kv_blocks=rng.randint(60, 160),
            preemption_mode=mode,
        )
        cap = config.capacity_tokens // 3
        reqs = make_requests(40, rate=rng.choice([20.0, 60.0]), prompt=(8, cap), output=(2, cap), seed=seed)
        engine = WatchedEngine(make_cost(), config, get_policy("aqua"))
        engine.run(reqs)
        assert engine.idle_rotation_steps == 0, (seed, config, engine.rotation_steps)
        rotation_steps += engine.rotation_steps
    assert rotation_steps > 50  # the workloads do put the policy under pressure


@pytest.mark.parametrize("mode", ["recompute", "offload_dram"])
def test_a_preempted_request_finishes_under_sustained_overload(mode: str) -> None:
    # Regression: least service first starved a served request. Three one-token requests arrive
    # every iteration and two run at a time, so new arrivals (service 0) queue without end; the
    # first of them rotated the 40-token request out after its 5th token (wakeup preemption), and
    # it stayed behind every later arrival: 5 tokens in 600 iterations. Aged after max_wait_iters,
    # it goes first and runs a full slice each time, so it finishes within
    # ceil(35 / slice_iters) waits of at most max_wait_iters + slice_iters + 2 iterations.
    horizon = 6.0
    reqs = [Request(0, 0.0, 16, 40)]
    reqs += [
        Request(1 + 3 * i + j, 0.05 + 0.01 * i, 16, 1) for i in range(int(horizon / 0.01)) for j in range(3)
    ]
    config = EngineConfig(
        max_num_batched_tokens=256, max_num_seqs=2, block_size=16, num_kv_blocks=1000, preemption_mode=mode
    )

    def first_request_tokens(max_wait_iters: int) -> list[float]:
        policy = AquaFairPolicy(slice_iters=4, max_wait_iters=max_wait_iters)
        return EngineSim(constant_cost(0.01), config, policy).run(reqs, until=horizon)[0].token_times

    assert len(first_request_tokens(10**9)) == 5  # no guard within the horizon: starved
    times = first_request_tokens(50)
    assert len(times) == 40
    bound_iterations = 5 + -(-35 // 4) * (50 + 4 + 2)
    assert times[-1] <= 0.01 * bound_iterations + 1e-9, (times[-1], bound_iterations)


def test_an_aged_request_gets_its_slice_once_its_sequence_is_recomputed() -> None:
    # Regression: an aged request's guaranteed slice counted from its admission, so with recompute
    # preemption a sequence that takes more than slice_iters iterations to prefill again lost its
    # protection mid-recompute and the next new arrival's wakeup preemption rotated it out before a
    # new token, every time: this 1,200-token prompt (5 chunks of the 256-token budget) stayed at
    # its 16th token for good, recomputing 1,024 tokens per wait. Its slice now starts once it
    # decodes again: every wait buys it slice_iters tokens.
    horizon = 6.0
    reqs = [Request(0, 0.0, 1200, 40)]
    reqs += [
        Request(1 + 3 * i + j, 0.2 + 0.01 * i, 16, 1) for i in range(int(horizon / 0.01)) for j in range(3)
    ]
    config = EngineConfig(
        max_num_batched_tokens=256,
        max_num_seqs=2,
        block_size=16,
        num_kv_blocks=1000,
        preemption_mode="recompute",
    )
    policy = AquaFairPolicy(slice_iters=4, max_wait_iters=50)
    times = EngineSim(constant_cost(0.01), config, policy).run(reqs, until=horizon)[0].token_times
    assert len(times) == 40
    # 16 tokens before the arrivals; then per wait (at most max_wait_iters + slice_iters + 2
    # iterations) a recompute of at most ceil(1240 / 255) chunks and slice_iters tokens.
    bound_iterations = 20 + -(-24 // 4) * (50 + 4 + 2 + 5)
    assert times[-1] <= 0.01 * bound_iterations + 1e-9, (times[-1], bound_iterations)
