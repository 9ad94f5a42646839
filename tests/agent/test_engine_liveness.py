"""A running engine that stops answering /health while its process lives on (deadlocked, stopped,
its HTTP server wedged) is failed, ended and restarted; one missed probe is not a hung engine.
Before the liveness probes, only an exit was noticed: a SIGSTOPped engine stayed `running`, and
the gateway kept routing requests to it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_agent.engines import EngineManager
from gpu_agent.engines.liveness import Liveness
from gpu_agent.protocol import DeploymentStatus
from serving.backoff import Backoff
from tests.agent.test_engines import alive, fake_launcher, spec
from tests.agent.ws_server import wait_for


class Engines:
    """A manager of fake engines probed every 0.2 s, one deployment `d1` at a time."""

    def __init__(self, tmp: Path, failures: int) -> None:
        self.pidfile = tmp / "pids"
        self.fail_file = tmp / "fail-health-once"
        self.statuses: list[DeploymentStatus] = []
        self.manager = EngineManager(
            fake_launcher(self.pidfile),
            str(tmp / "logs"),
            self.statuses.append,
            devices={0},
            backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.2, seed=1),
            health_timeout_s=20,
            grace_s=2,
            scrape_interval_s=0.2,
            liveness=Liveness(interval_s=0.2, timeout_s=0.5, failures=failures),
        )

    async def start(self) -> None:
        await self.manager.apply([spec(fake_args=["--health-fail-file", str(self.fail_file)])])
        await wait_for(lambda: self.states() == ["starting", "running"])

    def pids(self) -> list[int]:
        return [int(x) for x in self.pidfile.read_text().split()] if self.pidfile.exists() else []

    def states(self) -> list[str]:
        return [s.state for s in self.statuses]

    async def fail_one_probe(self) -> None:
        """The engine answers its next /health 503 (fake_engine.py removes the file then)."""
        self.fail_file.write_text("")
        await wait_for(lambda: not self.fail_file.exists(), timeout=5)


@pytest_asyncio.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Callable[[int], Engines]]:
    """Makes the test's `Engines` with a number of failures; closes it (ending a stopped engine
    too: engines/process_group.py continues it) when the test ends."""
    made: list[Engines] = []

    def make(failures: int) -> Engines:
        made.append(Engines(tmp_path, failures))
        return made[-1]

    yield make
    for e in made:
        await e.manager.close()


@pytest.mark.asyncio
async def test_it_fails_ends_and_restarts_an_engine_that_stopped_answering(
    engines: Callable[[int], Engines],
) -> None:
    e = engines(2)
    await e.start()
    hung = e.pids()[0]
    os.kill(hung, signal.SIGSTOP)  # alive, listening (the kernel accepts), answering nothing
    await wait_for(lambda: e.states() == ["starting", "running", "failed", "starting", "running"])
    error = e.statuses[2].error
    assert error is not None
    assert error.startswith("engine stopped answering /health: 2 checks failed over "), error
    assert "; last: no answer within 0.5 s; last log lines:\n" in error
    assert "fake engine ready" in error  # the log's tail, as for an engine that exited
    assert not alive(hung)
    assert len(e.pids()) == 2 and alive(e.pids()[1])
    assert e.statuses[-1].restarts == 1 and e.statuses[-1].port is not None


@pytest.mark.asyncio
async def test_a_non_200_answer_is_a_failed_probe(engines: Callable[[int], Engines]) -> None:
    e = engines(1)
    await e.start()
    await e.fail_one_probe()
    await wait_for(lambda: e.states()[2:] == ["failed", "starting", "running"])
    error = e.statuses[2].error
    assert error is not None and error.startswith("engine stopped answering /health: 1 check failed")
    assert "; last: HTTP 503; last log lines:" in error


@pytest.mark.asyncio
async def test_a_probe_that_passes_starts_the_count_of_failures_again(
    engines: Callable[[int], Engines],
) -> None:
    e = engines(2)
    await e.start()
    first = e.pids()
    for _ in range(2):  # two failed probes, never two in a row
        await e.fail_one_probe()
        await asyncio.sleep(1.0)  # probes every 0.2 s: some pass
    assert e.states() == ["starting", "running"]
    assert e.pids() == first and alive(first[0])
