"""The whole agent (LocalHost: CPU inventory, fake engine processes, the real Aqua coordinator)
against a real websocket server standing in for the control plane."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_agent.agent import Agent
from gpu_agent.engines import LaunchSpec, VllmLauncher
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory
from gpu_agent.protocol import Command, DeploymentSpec, DesiredDeployments, DeviceInfo, DeviceSample, dumps
from serving.backoff import Backoff
from tests.agent.test_engines import FAKE_ENGINE, fake_launcher, spec
from tests.agent.ws_server import ControlPlaneStub, wait_for


@pytest_asyncio.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Agent, ControlPlaneStub]]:
    server = ControlPlaneStub()
    await server.start()
    host = LocalHost(CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=2)
    agent = Agent(
        host, server.url, "good-token", name="cpu-box", address="127.0.0.1", backoff=Backoff(0.05, 0.2)
    )
    task = asyncio.create_task(agent.run())
    try:
        yield agent, server
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)
        await server.stop()


@pytest.mark.asyncio
async def test_it_registers_the_cpu_and_sends_telemetry_every_second(
    running: tuple[Agent, ControlPlaneStub],
) -> None:
    agent, server = running
    await wait_for(lambda: len(server.of_type("telemetry")) >= 3)
    register = server.frames[0][1]
    assert register["type"] == "register" and register["host"] == "cpu-box"
    assert register["simulated"] is False
    assert [d["kind"] for d in register["devices"]] == ["cpu"]
    # One sample a second of the wall clock (the agent wakes on each second): by the agent's sample
    # times, not by when this loop read the frames, nor by how long each tick's Aqua check took.
    stamps = [t["ts"] for t in server.of_type("telemetry")]
    seconds = [math.floor(ts) for ts in stamps]
    assert [b - a for a, b in itertools.pairwise(seconds)] == [1] * (len(seconds) - 1), stamps
    t = server.of_type("telemetry")[-1]
    assert t["devices"][0]["index"] == 0 and t["devices"][0]["aqua_role"] == "none"
    assert t["engines"] == [] and t["dropped"] == 0
    assert agent.host.aqua is not None and agent.host.aqua.socket_path is not None  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_it_runs_desired_deployments_and_answers_commands(
    running: tuple[Agent, ControlPlaneStub],
) -> None:
    agent, server = running
    await wait_for(lambda: agent.link.connected)
    await server.push(dumps(DesiredDeployments([spec("d1")])))

    def states() -> list[str]:
        return [s["state"] for s in server.of_type("deployment_status") if s["deployment_id"] == "d1"]

    await wait_for(lambda: states()[-1:] == ["running"])
    assert states() == ["starting", "running"]

    def engine_samples() -> list[dict[str, object]]:
        return [e for t in server.of_type("telemetry") for e in t["engines"] if e.get("ttft")]

    await wait_for(lambda: len(engine_samples()) >= 1, timeout=10)
    sample = engine_samples()[-1]
    assert (
        sample["deployment_id"] == "d1" and sample["state"] == "running" and sample["kv_cache_usage"] == 0.25
    )

    await server.push(dumps(Command("c1", "tail_log", "d1", lines=3)))
    await wait_for(lambda: len(server.of_type("log_tail")) == 1)
    tail = server.of_type("log_tail")[0]
    assert tail["command_id"] == "c1" and tail["lines"][-1] == "fake engine ready"

    await server.push(dumps(Command("c2", "restart_deployment", "nope")))
    await wait_for(lambda: len(server.of_type("error")) == 1)
    assert server.of_type("error")[0]["code"] == "unknown_deployment"

    await server.push(dumps(Command("c3", "restart_deployment", "d1")))
    await wait_for(lambda: states().count("running") == 2)
    assert server.of_type("deployment_status")[-1]["restarts"] == 1

    await server.push(dumps(DesiredDeployments([])))
    await wait_for(lambda: states()[-1:] == ["stopped"])


@pytest.mark.asyncio
async def test_it_reports_a_deployment_that_cannot_start_with_the_engines_error(
    running: tuple[Agent, ControlPlaneStub],
) -> None:
    agent, server = running
    await wait_for(lambda: agent.link.connected)
    await server.push(
        dumps(DesiredDeployments([spec("bad", fake_args=["--fail-at-start", "CUDA out of memory"])]))
    )
    await wait_for(lambda: any(s["state"] == "failed" for s in server.of_type("deployment_status")))
    failed = next(s for s in server.of_type("deployment_status") if s["state"] == "failed")
    assert failed["deployment_id"] == "bad" and "ValueError: CUDA out of memory" in failed["error"]


@pytest.mark.asyncio
async def test_it_resends_statuses_after_reconnecting(running: tuple[Agent, ControlPlaneStub]) -> None:
    agent, server = running
    await wait_for(lambda: agent.link.connected)
    await server.push(dumps(DesiredDeployments([spec("d1")])))
    await wait_for(lambda: [s["state"] for s in server.of_type("deployment_status")][-1:] == ["running"])
    await server.stop()
    await wait_for(lambda: not agent.link.connected)
    server.frames.clear()
    await server.start()
    await wait_for(lambda: len(server.of_type("deployment_status")) >= 1)
    assert server.frames[0][1]["type"] == "register"
    assert server.frames[1][1]["type"] == "deployment_status" and server.frames[1][1]["state"] == "running"


class TwoGpus(CpuInventory):
    """Unit-test stand-in: the CPU's figures reported as two GPUs, to host a producer/consumer pair."""

    def describe(self) -> list[DeviceInfo]:
        cpu = super().describe()[0]
        return [DeviceInfo(i, f"GPU-{i}", "test gpu", "gpu", cpu.memory_total_bytes, [1 - i]) for i in (0, 1)]

    def sample(self) -> list[DeviceSample]:
        cpu = super().sample()[0]
        return [dataclasses.replace(cpu, index=i) for i in (0, 1)]


@pytest.mark.asyncio
async def test_it_reports_lending_between_its_engines_through_the_coordinator(tmp_path: Path) -> None:
    # The real env contract (VllmLauncher) with a fake engine that leases / allocates like Aqua does.
    def launcher(s: DeploymentSpec, port: int) -> LaunchSpec:
        real = VllmLauncher("gpu", aqua_socket=str(tmp_path / "aqua.sock"))(s, port)
        extra = [str(a) for a in s.model.engine_options["fake_args"]]
        return LaunchSpec([sys.executable, FAKE_ENGINE, "--port", str(port), *extra], real.env)

    server = ControlPlaneStub()
    await server.start()
    host = LocalHost(TwoGpus(), str(tmp_path), launcher=launcher, grace_s=2)
    agent = Agent(
        host, server.url, "good-token", name="pair", address="127.0.0.1", backoff=Backoff(0.05, 0.2)
    )
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.link.connected)
        producer = spec("prod", [0], fake_args=["--aqua-lease", 1 << 20])
        consumer = spec("cons", [1], fake_args=["--aqua-allocate", 65536])
        await server.push(dumps(DesiredDeployments([producer, consumer])))

        def roles() -> list[tuple[str, int, int, int | None]]:
            t = server.of_type("telemetry")
            if not t:
                return []
            return [
                (d["aqua_role"], d["lent_bytes"], d["borrowed_bytes"], d["paired_with"])
                for d in t[-1]["devices"]
            ]

        await wait_for(
            lambda: roles() == [("producer", 1 << 20, 0, 1), ("consumer", 0, 65536, 0)], timeout=20
        )
        # The consumer goes: its session closes, the coordinator frees its allocation.
        await server.push(dumps(DesiredDeployments([producer])))
        await wait_for(lambda: roles() == [("producer", 1 << 20, 0, None), ("none", 0, 0, None)], timeout=20)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)
        await server.stop()
