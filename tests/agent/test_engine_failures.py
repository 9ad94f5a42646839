"""An engine that cannot even be launched is reported `failed`, never left `starting` by a dead
supervisor: bad options wait for a new spec, other launch errors are retried with backoff."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import pytest

from gpu_agent.engines import EngineConfigError, LaunchSpec, VllmLauncher
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, ModelSpec
from tests.agent.test_engines import fake_launcher, manager, spec
from tests.agent.ws_server import wait_for


class Statuses(list[DeploymentStatus]):
    def states(self) -> list[str]:
        return [s.state for s in self]


@pytest.mark.asyncio
async def test_it_reports_a_bad_engine_option_as_failed_and_waits_for_a_new_spec(
    tmp_path: Path,
) -> None:
    statuses = Statuses()
    m = manager(tmp_path, VllmLauncher("cpu", base_env={}), statuses)
    try:
        await m.apply([spec(seed="abc")])
        await wait_for(lambda: statuses.states() == ["failed"])
        error = statuses[0].error
        assert error is not None and "engine_options['seed']" in error and "'abc'" in error
        await asyncio.sleep(0.6)  # several backoff delays: the same spec is not tried again
        assert statuses.states() == ["failed"] and m.statuses()[0].restarts == 0
        assert await m.restart("d1") is True  # an operator's restart does try again
        await wait_for(lambda: statuses.states() == ["failed", "failed"])
        assert statuses[-1].restarts == 1
    finally:
        await m.close()
    assert statuses.states()[-1] == "stopped"


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("gpu", {"seed": "abc"}),
        ("gpu", {"max_num_seqs": True}),
        ("gpu", {"kv_cache_bytes": 1.5}),
        ("gpu", {"gpu_memory_utilization": "0.9"}),
        ("gpu", {"extra_args": "--x"}),
        # A flag the agent sets, abbreviated as vLLM's parser allows (a model saved before the
        # control plane refused them): the engine would refuse the gateway's key.
        ("gpu", {"extra_args": ["--api_k", "mine"]}),
        ("gpu", {"aqua_options": [1], "aqua": True}),
        ("cpu", {"cpu_threads": None}),
        ("cpu", {"cpu_kvcache_space_gib": float("nan")}),
    ],
)
def test_the_launcher_names_the_bad_engine_option(
    kind: Literal["gpu", "cpu"], options: dict[str, object]
) -> None:
    with pytest.raises(EngineConfigError, match=next(iter(options))):
        VllmLauncher(kind, base_env={})(
            DeploymentSpec("d1", ModelSpec("m", "/m", engine_options=options), [0]), 9000
        )


@pytest.mark.asyncio
async def test_it_reports_a_launch_error_and_retries_it_with_backoff(tmp_path: Path) -> None:
    statuses = Statuses()
    works = fake_launcher(tmp_path / "pids")
    calls = 0

    def flaky(s: DeploymentSpec, port: int) -> LaunchSpec:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("NVML not ready")
        return works(s, port)

    m = manager(tmp_path, flaky, statuses)
    try:
        await m.apply([spec()])
        await wait_for(lambda: statuses.states()[-1:] == ["running"])
    finally:
        await m.close()
    assert statuses.states()[:4] == ["failed", "failed", "starting", "running"]
    error = statuses[0].error
    assert error is not None and "RuntimeError: NVML not ready" in error
    assert statuses[3].restarts == 2
