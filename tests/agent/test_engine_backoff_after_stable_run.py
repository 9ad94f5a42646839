"""A run that lasted `stable_s` resets the restart backoff once, when it ends; the failures after it
(a launcher that now raises, say) back off as usual instead of each retrying after the first delay."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpu_agent.engines.command import LaunchSpec
from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus
from serving.backoff import Backoff
from tests.agent.test_engines import fake_launcher, spec
from tests.agent.ws_server import wait_for


class CountingBackoff(Backoff):
    resets = 0

    def reset(self) -> None:
        self.resets += 1
        super().reset()


@pytest.mark.asyncio
async def test_launch_failures_after_a_stable_run_keep_backing_off(tmp_path: Path) -> None:
    works = fake_launcher(tmp_path / "pids")
    calls = 0

    def launcher(s: DeploymentSpec, port: int) -> LaunchSpec:
        nonlocal calls
        calls += 1
        if calls == 1:
            return works(s, port)
        raise RuntimeError("the model's disk went away")

    statuses: list[DeploymentStatus] = []
    backoff = CountingBackoff(base_s=0.01, cap_s=0.05, seed=1)
    sup = EngineSupervisor(
        spec(),
        launcher,
        str(tmp_path / "logs" / "d1.log"),
        statuses.append,
        backoff=backoff,
        health_timeout_s=20,
        grace_s=2,
        scrape_interval_s=0.2,
        stable_s=0.0,  # every run that became healthy counts as stable
    )
    sup.start()
    try:
        await wait_for(lambda: sup.state == "running")
        pid = sup.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the stable run ends: one reset
        await wait_for(lambda: [s.state for s in statuses].count("failed") >= 5)
    finally:
        await sup.stop()
    # One reset, for the stable run; not one more per launch failure after it.
    assert backoff.resets == 1
    assert backoff.attempts >= 5
