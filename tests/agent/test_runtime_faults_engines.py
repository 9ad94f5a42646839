"""Engine faults while the agent runs: ports given twice, workers an engine leaves behind, a log
directory that cannot be created, desired lists arriving while the agent shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_agent.engines import EngineManager, LaunchSpec
from gpu_agent.engines.ports import PortAllocator, free_port
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus
from serving.backoff import Backoff
from tests.agent.test_engines import FAKE_ENGINE, alive, fake_launcher, spec
from tests.agent.ws_server import wait_for

# Starts a worker in the engine's process group that ignores SIGTERM (like a vLLM worker stuck in
# CUDA), writes its pid to argv[2], then becomes the fake engine on port argv[3].
LEAVES_A_WORKER = """
import os, subprocess, sys
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
with open(sys.argv[2], "a") as f:
    f.write(f"{worker.pid}\\n")
os.execv(sys.executable, [sys.executable, sys.argv[1], "--port", sys.argv[3]])
"""


class Statuses(list[DeploymentStatus]):
    def states(self, dep: str = "d1") -> list[str]:
        return [s.state for s in self if s.deployment_id == dep]


def manager(
    log_dir: Path,
    launcher: Callable[[DeploymentSpec, int], LaunchSpec],
    statuses: Statuses,
    *,
    ports: PortAllocator | None = None,
) -> EngineManager:
    return EngineManager(
        launcher,
        str(log_dir),
        statuses.append,
        devices={0, 1},
        backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.2, seed=1),
        health_timeout_s=20,
        grace_s=0.5,
        scrape_interval_s=0.2,
        ports=ports,
    )


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def kill_all(pid_list: list[int]) -> None:
    for pid in pid_list:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.asyncio
async def test_two_engines_started_together_never_share_a_port(tmp_path: Path) -> None:
    # The kernel may name one free port twice: the first engine has not bound it yet.
    same = free_port()
    other = next(p for p in iter(free_port, None) if p != same)
    picks = iter([same, same, other])
    ports = PortAllocator(pick=lambda: next(picks, None) or free_port())
    statuses = Statuses()
    m = manager(tmp_path / "logs", fake_launcher(tmp_path / "pids"), statuses, ports=ports)
    try:
        await m.apply([spec("d1", [0]), spec("d2", [1])])
        await wait_for(lambda: statuses.states("d1")[-1:] == ["running"] == statuses.states("d2")[-1:])
        assert "failed" not in statuses.states("d1") + statuses.states("d2")
        by_dep = {s.deployment_id: s.port for s in m.statuses()}
        assert by_dep["d1"] != by_dep["d2"] and ports.held == {by_dep["d1"], by_dep["d2"]}
    finally:
        await m.close()
    assert ports.held == set()  # given back once the engines are gone


@pytest.mark.asyncio
async def test_a_crashed_engine_gives_its_port_back(tmp_path: Path) -> None:
    statuses = Statuses()
    m = manager(tmp_path / "logs", fake_launcher(tmp_path / "pids"), statuses)
    try:
        await m.apply([spec()])
        await wait_for(lambda: statuses.states()[-1:] == ["running"])
        first = m.statuses()[0].port
        assert m.ports.held == {first}
        os.kill(pids(tmp_path / "pids")[0], signal.SIGKILL)
        await wait_for(lambda: statuses.states().count("running") == 2)
        assert m.ports.held == {m.statuses()[0].port}  # the dead engine's port is not kept
    finally:
        await m.close()


def leaving_launcher(tmp_path: Path) -> Callable[[DeploymentSpec, int], LaunchSpec]:
    def launch(s: DeploymentSpec, port: int) -> LaunchSpec:
        argv = [sys.executable, "-c", LEAVES_A_WORKER, FAKE_ENGINE, str(tmp_path / "workers"), str(port)]
        return LaunchSpec(argv, dict(os.environ))

    return launch


@pytest.mark.asyncio
async def test_stopping_an_engine_ends_the_workers_it_spawned(tmp_path: Path) -> None:
    statuses = Statuses()
    m = manager(tmp_path / "logs", leaving_launcher(tmp_path), statuses)
    try:
        await m.apply([spec()])
        await wait_for(lambda: statuses.states()[-1:] == ["running"])
        (worker,) = pids(tmp_path / "workers")
        await m.apply([])
        assert statuses.states()[-1] == "stopped"
        assert not alive(worker)  # it ignored SIGTERM: it was killed after the grace period
    finally:
        await m.close()
        kill_all(pids(tmp_path / "workers"))


@pytest.mark.asyncio
async def test_a_crashed_engines_workers_are_ended_before_it_is_restarted(tmp_path: Path) -> None:
    statuses = Statuses()
    m = manager(tmp_path / "logs", leaving_launcher(tmp_path), statuses)
    try:
        await m.apply([spec()])
        await wait_for(lambda: statuses.states()[-1:] == ["running"])
        (worker,) = pids(tmp_path / "workers")
        sup = m.supervisor("d1")
        assert sup is not None and sup.pid is not None
        os.kill(sup.pid, signal.SIGKILL)  # the OOM killer takes the engine, not its worker
        await wait_for(lambda: "failed" in statuses.states())
        assert not alive(worker)  # before the failure is reported, and before the restart
        await wait_for(lambda: statuses.states().count("running") == 2)
        assert len(pids(tmp_path / "workers")) == 2
    finally:
        await m.close()
        kill_all(pids(tmp_path / "workers"))


@pytest.mark.asyncio
async def test_a_log_directory_that_cannot_be_made_is_reported_and_retried(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("")  # a file where the state directory should be
    statuses = Statuses()
    m = manager(blocker / "logs", fake_launcher(tmp_path / "pids"), statuses)
    try:
        await m.apply([spec("d1", [0]), spec("d2", [1])])  # neither blocks the other
        await wait_for(lambda: "failed" in statuses.states("d1") and "failed" in statuses.states("d2"))
        error = next(s.error for s in statuses if s.state == "failed")
        assert error is not None and "NotADirectoryError" in error
        blocker.unlink()  # the operator fixes it: the engines start without a new spec
        blocker.mkdir()
        await wait_for(lambda: statuses.states("d1")[-1:] == ["running"] == statuses.states("d2")[-1:])
    finally:
        await m.close()


@pytest.mark.asyncio
async def test_a_desired_list_arriving_while_the_agent_stops_starts_nothing(tmp_path: Path) -> None:
    statuses = Statuses()
    m = manager(tmp_path / "logs", fake_launcher(tmp_path / "pids"), statuses)
    late = None
    try:
        await m.apply([spec("d1", [0])])
        await wait_for(lambda: statuses.states("d1")[-1:] == ["running"])
        closing = asyncio.create_task(m.close())  # the agent got SIGTERM: engines are stopping
        await asyncio.sleep(0)
        await m.apply([spec("d1", [0]), spec("d2", [1])])  # the control plane's list, meanwhile
        await closing
        late = m.supervisor("d2")
        assert late is None and m.statuses() == []
        assert statuses.states("d2") == []
        assert not any(alive(pid) for pid in pids(tmp_path / "pids"))
    finally:
        if late is not None:
            await late.stop()
