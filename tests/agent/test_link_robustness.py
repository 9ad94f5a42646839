"""No frame and no bug in the link takes a host off the control plane for good; hosts do not all
reconnect at the same moments."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import pytest
import pytest_asyncio

from gpu_agent.agent import Agent
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory
from gpu_agent.protocol import DeploymentStatus, DeviceSample, Frame, Telemetry
from serving.backoff import Backoff
from tests.agent.test_engines import fake_launcher
from tests.agent.test_link import REGISTER, Harness
from tests.agent.ws_server import ControlPlaneStub, wait_for

T = TypeVar("T")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ControlPlaneStub]:
    srv = ControlPlaneStub()
    await srv.start()
    yield srv
    with contextlib.suppress(AssertionError):
        await srv.stop()


def with_nan(obj: T, name: str) -> T:
    """`obj` with field `name` set to NaN behind its validation (as a buggy sampler might)."""
    object.__setattr__(obj, name, float("nan"))
    return obj


def make_agent(tmp_path: Path, server: ControlPlaneStub, name: str = "cpu-box", **kwargs: object) -> Agent:
    host = LocalHost(CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=2)
    return Agent(host, server.url, "good-token", name=name, address="127.0.0.1", **kwargs)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_agent(agent: Agent) -> AsyncIterator[Agent]:
    task = asyncio.create_task(agent.run())
    try:
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)


@pytest.mark.asyncio
async def test_it_drops_telemetry_that_cannot_be_serialised_and_keeps_the_link(
    server: ControlPlaneStub, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(server)
    with caplog.at_level(logging.ERROR, logger="gpu_agent.link"):
        async with h.running() as link:
            await wait_for(lambda: link.connected)
            # Strict JSON has no NaN: this frame can never be sent.
            bad = with_nan(DeviceSample(0, 1, 2), "temperature_c")
            link.submit_telemetry(Telemetry(ts=1.0, devices=[bad]))
            link.submit_telemetry(Telemetry(ts=2.0, devices=[DeviceSample(0, 1, 2, temperature_c=40.0)]))
            await wait_for(lambda: len(server.of_type("telemetry")) == 1)
            assert link.connected and link.stats.connects == 1
            assert link.buffered == 0  # not left at the head of the buffer, blocking the rest
    assert server.of_type("telemetry")[0]["ts"] == 2.0
    assert link.stats.unsendable == 1 and link.stats.telemetry_sent == 1
    assert any("'telemetry' frame that cannot be serialised" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_it_refuses_to_send_a_frame_that_cannot_be_serialised_without_raising(
    server: ControlPlaneStub,
) -> None:
    h = Harness(server)
    async with h.running() as link:
        await wait_for(lambda: link.connected)
        assert await link.send(with_nan(DeploymentStatus("d1", "running", 1.0), "ts")) is False
        assert await link.send(DeploymentStatus("d1", "running", 1.0)) is True
        await wait_for(lambda: len(server.of_type("deployment_status")) == 1)
        assert link.connected and link.stats.connects == 1
    assert link.stats.unsendable == 1


@pytest.mark.asyncio
async def test_it_logs_an_unexpected_error_and_reconnects_with_backoff(
    server: ControlPlaneStub, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(server)
    calls = 0

    def hello() -> list[Frame]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in building the hello")
        return [REGISTER]

    h.link._hello = hello
    with caplog.at_level(logging.WARNING, logger="gpu_agent.link"):
        async with h.running() as link:
            await wait_for(lambda: link.connected)
    assert calls == 2 and link.stats.connects == 1 and link.stats.failed_attempts >= 1
    assert server.of_type("register")
    unexpected = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert unexpected and unexpected[0].exc_info is not None  # with the traceback
    assert any("retrying in" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_the_agent_restarts_a_link_task_that_ends(
    tmp_path: Path, server: ControlPlaneStub, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(tmp_path, server, backoff=Backoff(0.05, 0.2))
    real_run = agent.link.run
    runs = 0

    async def run_that_breaks_once() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("link bug")
        await real_run()

    agent.link.run = run_that_breaks_once  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="gpu_agent.agent"):
        async with running_agent(agent):
            await wait_for(lambda: len(server.of_type("telemetry")) >= 1)
    assert runs == 2 and server.of_type("register")[0]["host"] == "cpu-box"
    stopped = [r for r in caplog.records if "link stopped unexpectedly" in r.getMessage()]
    assert len(stopped) == 1 and "RuntimeError: link bug" in stopped[0].getMessage()


def test_hosts_jitter_their_reconnects_differently_and_each_reproducibly(tmp_path: Path) -> None:
    server = ControlPlaneStub()  # never started: only the URL is used

    def delays(name: str) -> list[float]:
        backoff = make_agent(tmp_path / name, server, name=name).link.backoff
        return [backoff.next_delay() for _ in range(6)]

    assert delays("gpu-01") != delays("gpu-02")
    assert delays("gpu-01") == delays("gpu-01")
