"""The telemetry group-commit writer (agents/ingest.py): nothing submitted is lost, frames queued
while a write runs are taken by the same database-thread hop, a failed write loses only its own
frames, and submitters wait while the writer is too far behind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from agents import ingest
from agents.ingest import Batch, TelemetryWriter, rows_for
from agents.models import DeviceSample
from agents.services import LinkedHost
from channels.db import database_sync_to_async
from inventory.models import Device
from inventory.services import register_host

from gpu_agent.protocol import Telemetry, parse_frame

from .conftest import AgentHost, device_sample, telemetry_frame

# The database thread's connection clean-up may touch a connection left by an earlier test.
pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


def batch(host_id: int = 1, devices: int = 1) -> Batch:
    row = (1, None, 0, 0, None, None, None, "none", 0, 0, None)
    return Batch(host_id, [row] * devices, [])


class FakeWrites:
    """Stands in for write_rows: records each call's batches; the first call can be held."""

    def __init__(self, hold_first: bool = False, fail_first: bool = False) -> None:
        self.calls: list[list[Batch]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.fail_first = fail_first

    def __call__(self, batches: Sequence[Batch]) -> int:
        self.calls.append(list(batches))
        if len(self.calls) == 1:
            self.started.set()
            self.release.wait(30)
            if self.fail_first:
                raise RuntimeError("database went away")
        return sum(len(b.devices) for b in batches)


def count_hops(monkeypatch: pytest.MonkeyPatch, writer: TelemetryWriter) -> list[int]:
    hops: list[int] = []
    real = writer._write_pending

    def counted(loop: asyncio.AbstractEventLoop) -> None:
        hops.append(1)
        real(loop)

    monkeypatch.setattr(writer, "_write_pending", counted)
    return hops


async def wait_for(event: threading.Event) -> None:
    """Until the fake write has started (a bound, so that a broken writer fails instead of hanging)."""
    for _ in range(3000):
        if event.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the writer never started writing")


async def test_frames_queued_during_a_write_go_in_the_same_hop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ingest, "WRITE_STRETCH_S", 600.0)  # no deadline within the test
    fake = FakeWrites(hold_first=True)
    monkeypatch.setattr(ingest, "write_rows", fake)
    writer = TelemetryWriter()
    hops = count_hops(monkeypatch, writer)
    first = batch()
    await writer.submit(first)
    await wait_for(fake.started)
    later = [batch(), batch()]
    for b in later:
        await writer.submit(b)
    fake.release.set()
    await writer.flush()
    assert fake.calls == [[first], later]  # the second write took both frames queued meanwhile
    assert len(hops) == 1


async def test_a_failed_write_loses_only_its_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "WRITE_STRETCH_S", 600.0)
    fake = FakeWrites(hold_first=True, fail_first=True)
    monkeypatch.setattr(ingest, "write_rows", fake)
    writer = TelemetryWriter()
    hops = count_hops(monkeypatch, writer)
    lost, kept = batch(), batch()
    await writer.submit(lost)
    await wait_for(fake.started)
    await writer.submit(kept)
    fake.release.set()
    await writer.flush()
    assert fake.calls == [[lost], [kept]]
    assert len(hops) == 2  # after a failure the thread hands back (Django drops a broken connection)


async def test_submitters_wait_while_the_writer_is_too_far_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeWrites(hold_first=True)
    monkeypatch.setattr(ingest, "write_rows", fake)
    writer = TelemetryWriter(max_pending_rows=4)
    await writer.submit(batch(devices=1))
    await wait_for(fake.started)  # the first frame is being written; the queue is empty again
    await writer.submit(batch(devices=4))  # fills the queue up to the limit
    blocked = asyncio.create_task(writer.submit(batch(devices=1)))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    fake.release.set()  # the writer takes the full queue: room again
    await asyncio.wait_for(blocked, 30)
    await writer.flush()
    assert [sum(len(b.devices) for b in call) for call in fake.calls][:2] == [1, 4]
    assert sum(len(b.devices) for call in fake.calls for b in call) == 6


async def test_concurrent_frames_are_all_stored(agent_host: AgentHost) -> None:
    device = await database_sync_to_async(Device.objects.create)(
        host=agent_host.host, index=0, uuid="GPU-gpu-a-0", name="H100", memory_total_bytes=80 << 30
    )
    linked = LinkedHost(agent_host.host.pk, "gpu-a", "10.0.0.5", False, {0: device.pk})
    writer = TelemetryWriter(max_pending_rows=8)
    frame = parse_frame(telemetry_frame([device_sample(0)]))
    assert isinstance(frame, Telemetry)

    async def agent(n: int) -> None:
        for _ in range(n):
            await writer.submit(rows_for(linked, frame))
            await asyncio.sleep(0)

    await asyncio.gather(*(agent(25) for _ in range(8)))
    await writer.flush()
    assert await database_sync_to_async(DeviceSample.objects.count)() == 200


async def test_a_bad_frame_in_a_group_commit_loses_only_itself(
    agent_host: AgentHost, caplog: pytest.LogCaptureFixture
) -> None:
    """One agent's frame the database refuses must not drop the other hosts' frames written with it."""

    @database_sync_to_async
    def hosts() -> tuple[LinkedHost, LinkedHost]:
        linked = []
        for host in (agent_host.host, register_host("gpu-b")):
            device = Device.objects.create(
                host=host, index=0, uuid=f"GPU-{host.name}-0", name="H100", memory_total_bytes=80 << 30
            )
            linked.append(LinkedHost(host.pk, host.name, "10.0.0.5", False, {0: device.pk}))
        return linked[0], linked[1]

    good, bad = await hosts()
    frame = parse_frame(telemetry_frame([device_sample(0)]))
    assert isinstance(frame, Telemetry)
    refused = rows_for(bad, frame)
    # Past the parser's bounds (built here directly): SQLite raises OverflowError, PostgreSQL DataError.
    refused.devices[0] = (refused.devices[0][0], refused.devices[0][1], 2**64, *refused.devices[0][3:])
    writer = TelemetryWriter()
    for batch in (rows_for(good, frame), refused, rows_for(good, frame)):  # queued before the write
        await writer.submit(batch)
    await writer.flush()
    stored = await database_sync_to_async(list)(
        DeviceSample.objects.values_list("device__host__name", flat=True)
    )
    assert stored == ["gpu-a", "gpu-a"]
    assert any("host gpu-b" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
