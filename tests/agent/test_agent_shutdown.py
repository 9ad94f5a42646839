"""Stopping the agent (SIGTERM / SIGINT) while it is busy: it returns promptly, leaving no work
running against the host's engines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_agent.agent import Agent
from gpu_agent.host import Host, StatusCallback
from gpu_agent.protocol import (
    DeploymentSpec,
    DeploymentStatus,
    DeviceInfo,
    DeviceSample,
    EngineSample,
    Probe,
    ProbeRequestSpec,
    dumps,
)
from serving.backoff import Backoff
from tests.agent.ws_server import ControlPlaneStub, wait_for
from tests.planning import test_probe_runner as fake
from tests.planning.test_probe_runner import FakeEngine

engine = fake.engine  # the stand-in streaming engine (fixture)


class ProbedHost(Host):
    """A host whose one deployment ("7") is the stand-in streaming engine at `url`."""

    def __init__(self, url: str, spec: DeploymentSpec) -> None:
        self.url, self.spec = url, spec
        self.stopped = False

    async def start(self, on_status: StatusCallback) -> None:
        pass

    def describe(self) -> list[DeviceInfo]:
        return [DeviceInfo(0, "CPU-test", "cpu", "cpu", 2**30, [])]

    def sample(self) -> tuple[list[DeviceSample], list[EngineSample]]:
        return [DeviceSample(0, 0, 2**30)], []

    async def apply(self, deployments: list[DeploymentSpec]) -> None:
        pass

    async def restart(self, deployment_id: str) -> bool:
        return False

    def tail(self, deployment_id: str, lines: int) -> list[str] | None:
        return None

    def statuses(self) -> list[DeploymentStatus]:
        return []

    def engine_endpoint(self, deployment_id: str) -> tuple[str, DeploymentSpec] | None:
        return (self.url, self.spec) if deployment_id == self.spec.id else None

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def slow_tokens() -> Iterator[None]:
    saved = fake.TBT_S
    fake.TBT_S = 0.1  # 100 tokens: a stream nobody closes runs for 10 s
    yield
    fake.TBT_S = saved


async def started(host: Host) -> tuple[ControlPlaneStub, Agent, asyncio.Task[None]]:
    """A control-plane stub, and an agent of `host` running against it (not yet registered)."""
    server = ControlPlaneStub()
    await server.start()
    agent = Agent(host, server.url, "good-token", name="box", address="127.0.0.1", backoff=Backoff(0.05, 0.2))
    return server, agent, asyncio.create_task(agent.run())


@pytest.mark.asyncio
@pytest.mark.usefixtures("slow_tokens")
async def test_stopping_the_agent_ends_a_probe_it_is_replaying(engine: str, tmp_path: Path) -> None:
    host = ProbedHost(engine, fake.spec(tmp_path))
    server, agent, run = await started(host)
    try:
        await wait_for(lambda: server.of_type("register"))
        # 20 requests, one every 0.25 s, 100 tokens each: about 15 s of load if nobody stops it.
        requests = [ProbeRequestSpec(0.25 * k, 16, 100) for k in range(20)]
        await server.push(dumps(Probe("long", "7", 4.0, requests, timeout_s=60.0, seed=1)))
        await wait_for(lambda: FakeEngine.in_flight >= 2)
        stopped_at = time.monotonic()
        agent.stop()
        await asyncio.wait_for(asyncio.shield(run), 10)
        assert time.monotonic() - stopped_at < 3.0  # not the rest of the probe's schedule
        assert host.stopped
        # Answered, so the profile job waiting for it fails now, not once the host counts as offline.
        (report,) = server.of_type("probe_result")
        assert (report["probe_id"], report["ok"]) == ("long", False)
        assert "the agent stopped during the replay (box)" in report["error"]
        sent = len(FakeEngine.bodies)
        # Its streams were closed (the engine aborts their requests), and it sends no more.
        await wait_for(lambda: FakeEngine.in_flight == 0, timeout=5)
        await asyncio.sleep(0.6)  # more than two arrivals apart: a replay still running sends again
        assert len(FakeEngine.bodies) == sent
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
        await server.stop()


class SlowStoppingHost(ProbedHost):
    """Its `stop()` (the engines stopping) lasts until the test releases it."""

    def __init__(self, url: str, spec: DeploymentSpec) -> None:
        super().__init__(url, spec)
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()

    async def stop(self) -> None:
        self.stopping.set()
        await self.release.wait()
        self.stopped = True


@pytest.mark.asyncio
async def test_a_probe_that_comes_while_the_engines_stop_is_answered_as_failed_not_replayed(
    engine: str, tmp_path: Path
) -> None:
    # It used to start a replay that nobody cancelled: the agent's exit waited for its schedule.
    host = SlowStoppingHost(engine, fake.spec(tmp_path))
    server, agent, run = await started(host)
    try:
        await wait_for(lambda: server.of_type("register"))
        agent.stop()
        await asyncio.wait_for(host.stopping.wait(), 10)
        requests = [ProbeRequestSpec(0.25 * k, 16, 4) for k in range(20)]
        await server.push(dumps(Probe("late", "7", 4.0, requests, timeout_s=60.0, seed=1)))
        await wait_for(lambda: server.of_type("probe_result"), timeout=10)
        (report,) = server.of_type("probe_result")
        assert (report["probe_id"], report["ok"]) == ("late", False)
        assert "the agent is stopping (box)" in report["error"]
        assert FakeEngine.bodies == []
        host.release.set()
        await asyncio.wait_for(asyncio.shield(run), 10)
    finally:
        host.release.set()
        agent.stop()
        await asyncio.wait_for(run, 30)
        await server.stop()
