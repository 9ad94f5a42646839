"""Every number an agent's frame carries into a database column, at the ends of what the protocol
accepts: either it is stored as sent (the protocol's bounds are the columns'), or the frame is
answered with an `error` frame naming the field. Either way the link stays up and the other frames
are stored. Run on PostgreSQL too: SQLite stores any integer in any integer column, PostgreSQL
refuses a value beyond an ``integer`` (32-bit) or ``smallint`` column, or below a Positive* one.

Also the per-minute roll-up of such samples (agents.retention), which sums per-window counts into
32-bit columns and averages byte counts into 64-bit ones."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from agents.ingest import store_telemetry
from agents.models import DeviceMinute, DeviceSample, EngineMinute, EngineSample, Replica
from agents.retention import downsample_and_prune
from agents.services import LinkedHost, register
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from deployments.models import Deployment
from deployments.services import create_deployment
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventory.models import Device
from registry.models import ServedModel

from config.asgi import application
from gpu_agent.protocol import MAX_COUNT, MAX_DEVICE_INDEX, ProtocolError, Register, Telemetry, parse_frame

from .conftest import AgentHost, device_sample, register_frame, telemetry_frame

INT64_MAX = 2**63 - 1
HUGE = 1.7976931348623157e308  # the largest finite float
NO_SWEEP = override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0)


def engine_sample(deployment_id: str, **extra: Any) -> dict[str, Any]:
    return {"deployment_id": deployment_id, "state": "running", **extra}


def extreme_device(index: int) -> dict[str, Any]:
    return device_sample(
        index,
        memory_used_bytes=INT64_MAX,
        memory_free_bytes=INT64_MAX,
        utilization_pct=100.0,
        temperature_c=-HUGE,
        power_w=HUGE,
        aqua_role="producer",
        lent_bytes=INT64_MAX,
        borrowed_bytes=INT64_MAX,
        paired_with=MAX_DEVICE_INDEX,
    )


def extreme_engine(deployment_id: str) -> dict[str, Any]:
    return engine_sample(
        deployment_id,
        ttft={"count": MAX_COUNT, "p50": HUGE, "p99": HUGE},
        itl={"count": MAX_COUNT, "p50": HUGE, "p99": HUGE},
        kv_cache_usage=1.0,
        running=MAX_COUNT,
        waiting=MAX_COUNT,
        preemptions_total=INT64_MAX,
        bytes_offloaded=INT64_MAX,
    )


# ---- through the agent socket ------------------------------------------------------------------


@pytest_asyncio.fixture
async def link(
    agent_host: AgentHost, served_model: ServedModel
) -> AsyncIterator[tuple[WebsocketCommunicator, str]]:
    """A registered link of gpu-a with a deployment on its device 0 (the link knows it: it
    registered again after the deployment was made). Yields the link and the deployment's wire id."""
    with NO_SWEEP:
        comm = WebsocketCommunicator(
            application, "/ws/agent/", headers=[(b"authorization", f"Bearer {agent_host.token}".encode())]
        )
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"

        @database_sync_to_async
        def deploy() -> Deployment:
            device = Device.objects.get(host=agent_host.host, index=0)
            return create_deployment(served_model, agent_host.host, [device])

        deployment = await deploy()
        await comm.send_json_to(register_frame())
        while (answer := await comm.receive_json_from(timeout=5))["type"] != "desired_deployments":
            pass
        assert [d["id"] for d in answer["deployments"]] == [str(deployment.pk)]
        yield comm, str(deployment.pk)
        await comm.disconnect()


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await database_sync_to_async(predicate)():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.02)


async def answer_of(comm: WebsocketCommunicator) -> dict[str, Any]:
    """The next frame but a desired list (making the deployment pushes one, whenever it arrives)."""
    while (answer := await comm.receive_json_from(timeout=5))["type"] == "desired_deployments":
        pass
    return answer


async def refused(comm: WebsocketCommunicator, frame: dict[str, Any], field: str) -> None:
    """``frame`` is answered with a bad_frame `error` naming ``field``."""
    await comm.send_json_to(frame)
    answer = await answer_of(comm)
    assert answer["type"] == "error", answer
    assert (answer["code"], answer["field"]) == ("bad_frame", field), answer


async def still_up(comm: WebsocketCommunicator) -> None:
    await comm.send_to(text_data='{"v": 1, "type": "nope"}')
    answer = await answer_of(comm)
    assert (answer["type"], answer["field"]) == ("error", "type")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_telemetry_at_the_ends_of_the_protocol_is_stored_as_sent(
    link: tuple[WebsocketCommunicator, str],
) -> None:
    comm, dep = link
    frame = telemetry_frame([extreme_device(0), device_sample(1)], [extreme_engine(dep)])
    frame["dropped"] = INT64_MAX
    await comm.send_json_to(frame)
    await until(lambda: EngineSample.objects.exists() and DeviceSample.objects.count() == 2, "the samples")

    @database_sync_to_async
    def stored() -> tuple[DeviceSample, EngineSample]:
        return DeviceSample.objects.get(device__index=0), EngineSample.objects.get()

    device, engine = await stored()
    assert (device.memory_used_bytes, device.lent_bytes, device.borrowed_bytes) == (INT64_MAX,) * 3
    assert (device.power_w, device.temperature_c, device.paired_with) == (HUGE, -HUGE, MAX_DEVICE_INDEX)
    assert (engine.ttft_count, engine.itl_count, engine.running, engine.waiting) == (MAX_COUNT,) * 4
    assert (engine.preemptions_total, engine.bytes_offloaded, engine.ttft_p99) == (INT64_MAX, INT64_MAX, HUGE)
    await still_up(comm)


def dev(**extra: Any) -> Callable[[str], dict[str, Any]]:
    return lambda _: telemetry_frame([device_sample(0, **extra)])


def eng(**extra: Any) -> Callable[[str], dict[str, Any]]:
    return lambda dep: telemetry_frame([], [engine_sample(dep, **extra)])


def tel(**extra: Any) -> Callable[[str], dict[str, Any]]:
    return lambda _: {**telemetry_frame([device_sample(0)]), **extra}


def sta(**extra: Any) -> Callable[[str], dict[str, Any]]:
    return lambda dep: status(dep, **extra)


# (frame maker, field the error names): one past each end of what the columns hold.
BEYOND: list[tuple[str, Callable[[str], dict[str, Any]], str]] = [
    ("device index", lambda _: telemetry_frame([device_sample(-1)]), "devices[0].index"),
    ("paired_with", dev(paired_with=2**15), "devices[0].paired_with"),
    ("negative bytes", dev(lent_bytes=-1), "devices[0].lent_bytes"),
    ("used bytes", dev(memory_used_bytes=2**63), "devices[0].memory_used_bytes"),
    ("power", dev(power_w=-1.0), "devices[0].power_w"),
    ("ttft count", eng(ttft={"count": MAX_COUNT + 1}), "engines[0].ttft.count"),
    ("itl count", eng(itl={"count": -1}), "engines[0].itl.count"),
    ("p99", eng(ttft={"count": 1, "p99": -1.0}), "engines[0].ttft.p99"),
    ("running", eng(running=MAX_COUNT + 1), "engines[0].running"),
    ("waiting", eng(waiting=-1), "engines[0].waiting"),
    ("preemptions", eng(preemptions_total=-1), "engines[0].preemptions_total"),
    ("offloaded", eng(bytes_offloaded=2**63), "engines[0].bytes_offloaded"),
    ("dropped", tel(dropped=-1), "dropped"),
    ("ts", tel(ts=float(2**32)), "ts"),
    ("restarts", sta(restarts=MAX_COUNT + 1), "restarts"),
    ("negative restarts", sta(restarts=-1), "restarts"),
    ("port 0", sta(port=0), "port"),
    ("port", sta(port=65536), "port"),
    ("huge port", sta(port=INT64_MAX), "port"),
    ("status ts", sta(ts=-1.0), "ts"),
]


def status(deployment_id: str, **extra: Any) -> dict[str, Any]:
    frame = {"v": 1, "type": "deployment_status", "deployment_id": deployment_id, "state": "running"}
    return {**frame, "ts": time.time(), **extra}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize(("what", "make", "field"), BEYOND, ids=[b[0] for b in BEYOND])
async def test_a_value_beyond_its_column_is_refused_naming_the_field(
    link: tuple[WebsocketCommunicator, str], what: str, make: Callable[[str], dict[str, Any]], field: str
) -> None:
    comm, dep = link
    await refused(comm, make(dep), field)
    # The link stays up, and the next frames are stored.
    await comm.send_json_to(telemetry_frame([device_sample(0)], [engine_sample(dep, running=1)]))
    await comm.send_json_to(status(dep))
    await until(lambda: EngineSample.objects.exists() and Replica.objects.exists(), "the next frames")
    await still_up(comm)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_status_at_the_ends_of_the_protocol_is_stored_as_sent(
    link: tuple[WebsocketCommunicator, str],
) -> None:
    comm, dep = link
    await comm.send_json_to(status(dep, restarts=MAX_COUNT, port=65535, ts=float(2**32) - 1))
    await until(lambda: Replica.objects.exists(), "the replica")
    replica = await database_sync_to_async(Replica.objects.get)()
    assert (replica.restarts, replica.port) == (MAX_COUNT, 65535)
    assert replica.base_url == "http://10.0.0.5:65535"
    await still_up(comm)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_log_tail_of_an_id_beyond_a_key_is_refused(link: tuple[WebsocketCommunicator, str]) -> None:
    comm, _ = link
    for dep in (str(INT64_MAX), str(2**63), "9" * 40, "-1"):
        await comm.send_json_to({"v": 1, "type": "log_tail", "deployment_id": dep, "lines": ["x"]})
        answer = await answer_of(comm)
        assert (answer["type"], answer["field"]) == ("error", "deployment_id"), answer
    await still_up(comm)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_register_at_the_ends_of_the_protocol_is_stored_and_one_beyond_is_refused(
    agent_host: AgentHost,
) -> None:
    with NO_SWEEP:
        comm = WebsocketCommunicator(
            application, "/ws/agent/", headers=[(b"authorization", f"Bearer {agent_host.token}".encode())]
        )
        assert (await comm.connect())[0]
        beyond = register_frame(gpus=1)
        beyond["devices"][0]["index"] = MAX_DEVICE_INDEX + 1
        await refused(comm, beyond, "devices[0].index")
        beyond = register_frame(gpus=1)
        beyond["devices"][0]["memory_total_bytes"] = -1
        await refused(comm, beyond, "devices[0].memory_total_bytes")
        await refused(comm, {**register_frame(gpus=1), "heartbeat_interval_s": HUGE}, "heartbeat_interval_s")
        frame = register_frame(gpus=1)
        frame["devices"][0].update(index=MAX_DEVICE_INDEX, memory_total_bytes=INT64_MAX, nvlink_peers=[0])
        await comm.send_json_to({**frame, "heartbeat_interval_s": 60.0})
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        device = await database_sync_to_async(Device.objects.get)(host=agent_host.host)
        assert (device.index, device.memory_total_bytes) == (MAX_DEVICE_INDEX, INT64_MAX)
        await comm.send_json_to(telemetry_frame([extreme_device(MAX_DEVICE_INDEX)]))
        await until(lambda: DeviceSample.objects.exists(), "the sample")
        await still_up(comm)
        await comm.disconnect()


# ---- the writer and the per-minute roll-up, without a socket ------------------------------------


def linked_host(agent_host: AgentHost, gpus: int = 2) -> LinkedHost:
    frame = parse_frame(register_frame(gpus=gpus), sender="agent")
    assert isinstance(frame, Register)
    return register(agent_host.host, frame)


def telemetry(devices: list[dict[str, Any]], engines: list[dict[str, Any]], ts: float) -> Telemetry:
    frame = parse_frame({**telemetry_frame(devices, engines), "ts": ts}, sender="agent")
    assert isinstance(frame, Telemetry)
    return frame


@pytest.mark.django_db(transaction=True)
def test_samples_at_the_ends_of_the_protocol_fold_into_minutes(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """Two windows of a minute, each with the most requests a window may count, are one minute of
    more than a 32-bit column holds: the minute holds the most it can. Two samples of the most
    bytes average to that, not one past it; two of the largest floats to that, not infinity."""
    linked = linked_host(agent_host)
    device = Device.objects.get(host=agent_host.host, index=0)
    dep = create_deployment(served_model, agent_host.host, [device])
    linked.deployment_ids.add(dep.pk)
    start = (int(time.time()) // 60 - 120) * 60  # two hours ago, at a minute's start
    for second in (1, 2, 3):
        store_telemetry(linked, telemetry([extreme_device(0)], [extreme_engine(str(dep.pk))], start + second))

    downsample_and_prune()  # raises on PostgreSQL for a value beyond a column

    minute = EngineMinute.objects.get()
    assert (minute.samples, minute.ttft_count, minute.itl_count) == (3, MAX_COUNT, MAX_COUNT)
    assert (minute.ttft_p50, minute.ttft_p99, minute.running) == (HUGE, HUGE, MAX_COUNT)
    assert (minute.preemptions_total, minute.bytes_offloaded) == (INT64_MAX, INT64_MAX)
    dev_minute = DeviceMinute.objects.get()
    assert dev_minute.minute == datetime.fromtimestamp(start, UTC)
    assert (dev_minute.memory_used_bytes, dev_minute.memory_free_bytes) == (INT64_MAX, INT64_MAX)
    assert (dev_minute.memory_used_max_bytes, dev_minute.lent_bytes) == (INT64_MAX, INT64_MAX)
    assert (dev_minute.power_w, dev_minute.temperature_c) == (HUGE, -HUGE)
    assert not DeviceSample.objects.exists() and not EngineSample.objects.exists()


# ---- a walk over the numbers of a telemetry frame -------------------------------------------------

INT_EDGES = [0, 1, -1, 2**15 - 1, 2**15, 2**31 - 1, 2**31, 2**32, 2**63 - 1, -(2**63)]
# Mostly in range (a frame with one bad number is refused whole: it would store nothing), at times not.
ints = st.sampled_from(INT_EDGES) | st.integers(0, 2**15 - 1) | st.integers(-(2**63), 2**63 - 1)
floats = st.sampled_from([0.0, -0.0, 1.0, -1.0, 100.0, 100.5, HUGE, -HUGE, 5e-324]) | st.floats(
    allow_nan=False, allow_infinity=False
)
DEVICE_INTS = ["memory_used_bytes", "memory_free_bytes", "lent_bytes", "borrowed_bytes", "paired_with"]
DEVICE_FLOATS = ["utilization_pct", "temperature_c", "power_w"]
ENGINE_INTS = ["running", "waiting", "preemptions_total", "bytes_offloaded"]


@st.composite
def telemetry_values(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    device = device_sample(0)
    for name in DEVICE_INTS:
        if draw(st.booleans()):
            device[name] = draw(ints)
    for name in DEVICE_FLOATS:
        if draw(st.booleans()):
            device[name] = draw(floats)
    engine = engine_sample("")
    for name in ENGINE_INTS:
        if draw(st.booleans()):
            engine[name] = draw(ints)
    for name in ("ttft", "itl"):
        if draw(st.booleans()):
            engine[name] = {"count": draw(ints), "p50": draw(floats), "p99": draw(floats)}
    if draw(st.booleans()):
        engine["kv_cache_usage"] = draw(floats)
    return device, engine


@pytest.mark.django_db(transaction=True)
def test_any_telemetry_numbers_are_stored_or_refused_naming_the_field(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    """Whatever the numbers, a frame either parses, is stored and folds into a minute whose values
    fit their columns, or is refused by the protocol naming a numeric field of a sample: never a
    database error. Each example is two samples of one minute of its own, folded at once."""
    linked = linked_host(agent_host, gpus=1)
    device = Device.objects.get(host=agent_host.host, index=0)
    dep = create_deployment(served_model, agent_host.host, [device])
    linked.deployment_ids.add(dep.pk)
    minutes = iter(range((int(time.time()) // 60 - 180) * 60, 2**40, 60))  # from three hours ago

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(values=telemetry_values())
    def walk(values: tuple[dict[str, Any], dict[str, Any]]) -> None:
        device_values, engine_values = values
        engine_values = {**engine_values, "deployment_id": str(dep.pk)}
        minute = next(minutes)
        try:
            frame = telemetry([device_values], [engine_values], minute + 1)
        except ProtocolError as exc:
            assert exc.field.startswith(("devices[0].", "engines[0].")), exc
            return
        store_telemetry(linked, frame)
        store_telemetry(linked, frame)
        downsample_and_prune()  # raises for a minute beyond its columns (PostgreSQL, at times SQLite)
        at = datetime.fromtimestamp(minute, UTC)
        engine = EngineMinute.objects.get(minute=at)
        assert engine.samples == 2
        assert 0 <= engine.ttft_count <= MAX_COUNT and 0 <= engine.itl_count <= MAX_COUNT
        dev_minute = DeviceMinute.objects.get(minute=at)
        assert dev_minute.memory_used_bytes == device_values["memory_used_bytes"]
        for value in (dev_minute.power_w, dev_minute.temperature_c, dev_minute.utilization_pct):
            assert value is None or math.isfinite(value)

    walk()
    assert not DeviceSample.objects.exists() and not EngineSample.objects.exists()
