"""Two agents on one machine: each reports its own CPU device, and an agent whose `register` the
control plane refuses says why at ERROR and backs off, instead of sending heartbeats and telemetry
that are all refused (`not_registered`) every second, forever."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.server import ServerConnection

import gpu_agent.inventory as inventory_pkg
from gpu_agent.inventory import CpuInventory, detect_inventory
from gpu_agent.link import AgentLink
from gpu_agent.protocol import CLOSE_REGISTER_REFUSED, ErrorFrame, Frame, Heartbeat, dumps
from serving.backoff import Backoff
from tests.agent.fake_nvml import FakeNvml
from tests.agent.test_link import REGISTER, telemetry
from tests.agent.ws_server import ControlPlaneStub, wait_for

CONFLICT = "device 0 (uuid 'CPU-x') is already registered by host 'local' as its device 0"


def test_agents_of_different_hosts_on_one_machine_report_different_cpu_devices() -> None:
    local, other = CpuInventory("local"), CpuInventory("rohost")
    assert local.describe()[0].uuid != other.describe()[0].uuid
    assert CpuInventory("rohost").describe()[0].uuid == other.describe()[0].uuid  # stable
    # An agent named after the machine (the default name) keeps the uuid it always had.
    machine = socket.gethostname()
    before = f"CPU-{uuid.uuid5(uuid.NAMESPACE_DNS, machine)}"
    assert CpuInventory(machine).describe()[0].uuid == CpuInventory().describe()[0].uuid == before


def test_the_agent_name_reaches_the_cpu_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory_pkg, "_warned_no_driver", True)
    inv = detect_inventory(FakeNvml([]), agent_name="rohost")
    assert inv.describe()[0].uuid == CpuInventory("rohost").describe()[0].uuid


class RefusingControlPlane(ControlPlaneStub):
    """Refuses every `register` as this control plane does (`register_refused`, close 4422), or, with
    `keep_link`, as one before it did: a `bad_frame` error, the link kept, and every later frame
    answered `not_registered`."""

    def __init__(self, keep_link: bool = False) -> None:
        super().__init__()
        self.keep_link = keep_link

    async def _handler(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        async for message in ws:
            frame = json.loads(message)
            self.frames.append((time.monotonic(), frame))
            if frame["type"] != "register":
                await ws.send(dumps(ErrorFrame("not_registered", f"send `register` before {frame['type']}")))
            elif self.keep_link:
                await ws.send(
                    dumps(ErrorFrame("bad_frame", f"cannot store the devices: {CONFLICT}", "devices"))
                )
            else:
                await ws.send(dumps(ErrorFrame("register_refused", CONFLICT, "devices")))
                await ws.close(CLOSE_REGISTER_REFUSED, "register refused")


@pytest_asyncio.fixture(params=[False, True], ids=["closing", "keeping-the-link"])
async def refusing(request: pytest.FixtureRequest) -> AsyncIterator[RefusingControlPlane]:
    srv = RefusingControlPlane(keep_link=request.param)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.mark.asyncio
async def test_a_refused_register_is_logged_with_its_reason_and_retried_with_backoff(
    refusing: RefusingControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[Frame] = []

    async def on_frame(frame: Frame) -> None:
        received.append(frame)

    link = AgentLink(
        refusing.url,
        "good-token",
        hello=lambda: [REGISTER],
        on_frame=on_frame,
        heartbeat_interval_s=0.05,
        backoff=Backoff(base_s=0.2, cap_s=0.4, seed=3),
    )
    task = asyncio.create_task(link.run())
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_agent.link"):
            for i in range(30):  # telemetry every 0.05 s for 1.5 s
                link.submit_telemetry(telemetry(float(i)))
                await asyncio.sleep(0.05)
            await wait_for(lambda: link.stats.register_refusals >= 3)
    finally:
        link.stop()
        await asyncio.wait_for(task, 5)
    registers = len(refusing.of_type("register"))
    # Backoff of 0.1-0.4 s between connections over ~1.5 s: a handful, not one per heartbeat.
    assert 3 <= registers <= 10
    assert link.stats.register_refusals >= registers - 1
    # At most one heartbeat per connection reaches the control plane (before its refusal is read).
    assert len(refusing.of_type("heartbeat")) <= registers
    errors = [
        r.getMessage() for r in caplog.records if r.name == "gpu_agent.link" and r.levelno >= logging.ERROR
    ]
    assert len(errors) >= 3
    assert all("refused this agent's register" in m and CONFLICT in m for m in errors), errors
    # The refusal is the link's to report; the agent is not handed the refusals to log again.
    codes = {f.code for f in received if isinstance(f, ErrorFrame)}
    assert not codes & {"register_refused", "not_registered"}


@pytest.mark.asyncio
async def test_other_error_frames_keep_the_link(caplog: pytest.LogCaptureFixture) -> None:
    srv = ControlPlaneStub()
    await srv.start()
    received: list[Any] = []

    async def on_frame(frame: Frame) -> None:
        received.append(frame)

    link = AgentLink(srv.url, "good-token", hello=lambda: [REGISTER], on_frame=on_frame)
    task = asyncio.create_task(link.run())
    try:
        await wait_for(lambda: link.connected)
        await srv.push(dumps(ErrorFrame("unknown_device", "device index 3 was not registered", "devices")))
        await wait_for(lambda: len(received) == 1)
        await link.send(Heartbeat(ts=1.0))
        await wait_for(lambda: len(srv.of_type("heartbeat")) >= 1)
        assert link.connected and link.stats.register_refusals == 0 and link.stats.connects == 1
    finally:
        link.stop()
        await asyncio.wait_for(task, 5)
        await srv.stop()
