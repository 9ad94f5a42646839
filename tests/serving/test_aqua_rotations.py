"""Aqua's rotations in the simulator: a preemption for fairness must let a waiting request in."""

from __future__ import annotations

import random

import pytest

from serving.policies import get_policy
from serving.sim.config import EngineConfig
from serving.sim.engine import EngineSim
from tests.serving.conftest import make_cost, make_requests


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
