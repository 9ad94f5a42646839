"""Faults the agent must ride out: a GPU already lost when it starts, an engine log it cannot read,
and the port of an engine that is no longer up."""

from __future__ import annotations

import asyncio
import errno
import io
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpu_agent.agent import Agent
from gpu_agent.engines import logs
from gpu_agent.engines.logs import tail_lines
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory, NvmlInventory
from gpu_agent.protocol import Command, DeviceSample, dumps, loads
from serving.backoff import Backoff
from tests.agent.fake_nvml import FakeGpu, FakeNvml
from tests.agent.test_engines import fake_launcher, spec
from tests.agent.test_runtime_faults_engines import Statuses, manager, pids
from tests.agent.ws_server import ControlPlaneStub, wait_for

SWITCH = 2
GPU_IS_LOST, UNKNOWN = 15, 999

# ---- a GPU lost before the agent starts --------------------------------------------------------


def switch_gpus(lost_call: str, code: int) -> FakeNvml:
    """Three GPUs on an NVSwitch; GPU 1 raises `code` from `lost_call` and every query after it."""
    calls = [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
    ]
    gpus = [
        FakeGpu(f"00000000:{bus}:00.0", links=[("0000:c0:00.0", SWITCH)] * 2) for bus in ("17", "2A", "3D")
    ]
    gpus[1].errors = {call: code for call in calls[calls.index(lost_call) :]}
    return FakeNvml(gpus)


LOST_AT = [
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
]


@pytest.mark.parametrize("code", [GPU_IS_LOST, UNKNOWN])
@pytest.mark.parametrize("lost_call", LOST_AT)
def test_it_leaves_out_a_gpu_lost_before_it_starts_and_keeps_the_others_indices(
    caplog: pytest.LogCaptureFixture, lost_call: str, code: int
) -> None:
    nvml = switch_gpus(lost_call, code)
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory.nvml"):
        inventory = NvmlInventory(nvml)
        devices = inventory.describe()
        first, second = inventory.sample(), inventory.sample()

    # Deployments name devices by NVML index: GPU 2 stays 2, and no one is a peer of GPU 1.
    assert [(d.index, d.uuid, d.nvlink_peers) for d in devices] == [
        (0, "GPU-00000000:17:00.0", [2]),
        (2, "GPU-00000000:3D:00.0", [0]),
    ]
    assert first == second
    assert [(d.index, d.memory_used_bytes, d.utilization_pct) for d in first] == [
        (0, 2**30, 40.0),
        (2, 2**30, 40.0),
    ]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "GPU 1" in errors[0] and caplog.records[0].levelno == logging.ERROR


def test_a_gpu_whose_nvlink_cannot_be_read_is_kept_without_peers() -> None:
    devices = NvmlInventory(switch_gpus("nvmlDeviceGetNvLinkState", GPU_IS_LOST)).describe()
    assert [(d.index, d.nvlink_peers) for d in devices] == [(0, [2]), (1, []), (2, [0])]


@pytest.mark.asyncio
async def test_the_agent_registers_and_samples_the_readable_gpus(tmp_path: Path) -> None:
    host = LocalHost(
        NvmlInventory(switch_gpus("nvmlDeviceGetUUID", GPU_IS_LOST)), str(tmp_path), with_aqua=False
    )
    agent = Agent(host, "http://127.0.0.1:9", "token", name="gpu-box", address="127.0.0.1")
    await host.start(lambda status: None)
    try:
        host.readings.refresh()  # a telemetry tick's sample (the agent takes it in a worker thread)
        register, telemetry = agent.register_frame(), agent.telemetry_frame()
        assert [d.index for d in register.devices] == [0, 2]
        assert [d.index for d in telemetry.devices] == [0, 2]
        for frame in (register, telemetry):  # valid frames for the control plane
            assert loads(dumps(frame), sender="agent") == frame
    finally:
        await host.stop()


def test_a_gpu_lost_after_the_start_is_still_reported_empty() -> None:
    nvml = switch_gpus("nvmlDeviceGetHandleByIndex", GPU_IS_LOST)
    errors = nvml.gpus[1].errors
    nvml.gpus[1].errors = {}
    inventory = NvmlInventory(nvml)
    nvml.gpus[1].errors = errors  # it falls off the bus while the agent runs
    assert [d.index for d in inventory.describe()] == [0, 1, 2]
    assert inventory.sample()[1] == DeviceSample(index=1, memory_used_bytes=0, memory_free_bytes=0)


# ---- an engine log that cannot be read ---------------------------------------------------------


class FailingRead(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("a directory", "Is a directory"),
        ("no permission", "Permission denied"),
        ("an I/O error", "Input/output error"),
    ],
)
def test_it_says_why_a_log_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, reason: str
) -> None:
    path = tmp_path / "d1.log"
    if fault == "a directory":
        path.mkdir()
    else:
        path.write_bytes(b"line\n")
        if fault == "no permission":  # chmod does not stop root, which runs the tests in CI
            error = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            monkeypatch.setattr(logs, "open", lambda *a: (_ for _ in ()).throw(error), raising=False)
        else:
            monkeypatch.setattr(logs, "open", lambda *a: FailingRead(b"line\n"), raising=False)
    assert tail_lines(str(path), 10) == [f"[cannot read the log: {reason}]"]


class BrokenTailHost(LocalHost):
    def tail(self, deployment_id: str, lines: int) -> list[str] | None:
        raise RuntimeError("the log store is gone")


@asynccontextmanager
async def running_agent(host: LocalHost) -> AsyncIterator[ControlPlaneStub]:
    server = ControlPlaneStub()
    await server.start()
    agent = Agent(
        host, server.url, "good-token", name="cpu-box", address="127.0.0.1", backoff=Backoff(0.05, 0.2)
    )
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.link.connected)
        yield server
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)
        await server.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["unreadable log", "host error"])
async def test_a_log_tail_command_is_answered_when_the_log_cannot_be_read(tmp_path: Path, fault: str) -> None:
    kind = BrokenTailHost if fault == "host error" else LocalHost
    host = kind(CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), with_aqua=False)
    (tmp_path / "logs" / "d1.log").mkdir(parents=True)  # a log the agent cannot read
    async with running_agent(host) as server:
        await server.push(dumps(Command("c1", "tail_log", "d1", lines=10)))
        await wait_for(lambda: len(server.of_type("log_tail")) == 1, timeout=5)
    answer = server.of_type("log_tail")[0]
    assert answer["command_id"] == "c1" and answer["deployment_id"] == "d1"
    expected = "Is a directory" if fault == "unreadable log" else "RuntimeError: the log store is gone"
    assert answer["lines"] == [f"[cannot read the log: {expected}]"]


# ---- the port of an engine that is not up ------------------------------------------------------


@pytest.mark.asyncio
async def test_failed_and_stopped_statuses_carry_no_port(tmp_path: Path) -> None:
    statuses = Statuses()
    m = manager(tmp_path / "logs", fake_launcher(tmp_path / "pids"), statuses)
    try:
        await m.apply([spec()])
        await wait_for(lambda: statuses.states()[-1:] == ["running"])
        assert m.statuses()[0].port is not None
        os.kill(pids(tmp_path / "pids")[0], signal.SIGKILL)
        await wait_for(lambda: statuses.states().count("running") == 2)
    finally:
        await m.close()
    ports = [(s.state, s.port is not None) for s in statuses]
    assert ports == [
        ("starting", True),
        ("running", True),
        ("failed", False),
        ("starting", True),
        ("running", True),
        ("stopped", False),
    ]
    assert m.statuses() == []  # gone once stopped


@pytest.mark.asyncio
async def test_an_engine_that_fails_at_start_reports_no_port(tmp_path: Path) -> None:
    statuses = Statuses()
    m = manager(tmp_path / "logs", fake_launcher(tmp_path / "pids"), statuses)
    try:
        await m.apply([spec(fake_args=["--fail-at-start", "boom"])])
        await wait_for(lambda: "failed" in statuses.states())
        failed = next(s for s in statuses if s.state == "failed")
        assert failed.port is None and "boom" in (failed.error or "")
        await wait_for(lambda: m.statuses()[0].state == "failed")
        assert m.statuses()[0].port is None  # what a reconnect re-sends, too
    finally:
        await m.close()
