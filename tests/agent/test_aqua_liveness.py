"""The agent's liveness check of its hosted Aqua coordinator: a coordinator whose thread died with
its socket file left, or whose loop hangs (connections accepted, never answered), is restarted
after `probe_failures` failed probes in a row; a healthy one never is. The check (seconds, while
the coordinator is sick) never holds up the agent's event loop.

Ticks here call `refresh()` (check and sample) directly, as the agent's worker thread does."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from gpu_agent.agent import Agent
from gpu_agent.aqua import AquaHost
from gpu_agent.host import LocalHost
from gpu_agent.inventory import CpuInventory
from serving.backoff import Backoff
from tests.agent.test_engines import fake_launcher
from tests.agent.ws_server import ControlPlaneStub, wait_for
from tests.aqua.conftest import hung, wait_until

coordinator = pytest.importorskip("serving.aqua.coordinator", reason="serving.aqua.coordinator not present")

PROBE_TIMEOUT_S = 0.2
TICK_LIMIT_S = 2.0  # what one telemetry tick may take, even while the coordinator is sick


def make_host(tmp_path: Path) -> AquaHost:
    host = AquaHost(
        str(tmp_path / "aqua.sock"), probe_timeout_s=PROBE_TIMEOUT_S, probe_failures=3, stop_timeout_s=0.5
    )
    assert host.start() is True
    return host


def tick(host: AquaHost) -> dict[str, object] | None:
    """One telemetry tick; checks that it did not hold the agent up."""
    t0 = time.monotonic()
    stats = host.refresh()
    assert time.monotonic() - t0 < TICK_LIMIT_S
    return stats


def answers(path: str) -> bool:
    try:
        with coordinator.AquaClient(path, timeout=2.0, connect_timeout=0) as client:
            client.ping()
    except coordinator.CoordinatorUnavailable:
        return False
    return True


def test_it_never_restarts_a_healthy_coordinator(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    try:
        server = host._server
        with coordinator.AquaClient(host.requested_socket, name="prod") as producer:
            producer.lease("dep-prod", "cuda:0", 1 << 20, {"kind": "test"})
            for _ in range(10):
                stats = tick(host)
                assert stats is not None and len(stats["regions"]) == 1  # type: ignore[arg-type]
            assert producer.connected()
        assert host.restarts == 0 and host._server is server
    finally:
        host.stop()


def test_it_restarts_a_coordinator_whose_thread_died_leaving_its_socket_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = make_host(tmp_path)
    path = host.requested_socket
    try:
        host._server.stop()  # the serving thread ends ...
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(path)  # ... and a socket file nothing listens on is left behind
        stale.close()
        assert not answers(path)
        with caplog.at_level(logging.WARNING, logger="gpu_agent.aqua"):
            assert tick(host) is None and tick(host) is None  # two failed probes: not yet
            assert host.restarts == 0
            stats = tick(host)  # the third: restarted, and the fresh coordinator answers
        assert host.restarts == 1 and stats is not None and stats["regions"] == []
        assert answers(path)
        assert any(r.levelno == logging.ERROR and "liveness probes" in r.getMessage() for r in caplog.records)
    finally:
        host.stop()
    assert not os.path.exists(path)


def test_it_restarts_a_hung_coordinator_and_its_clients_are_told(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    path = host.requested_socket
    old = host._server
    try:
        producer = coordinator.AquaClient(path, name="prod", timeout=30.0)
        producer.lease("dep-prod", "cuda:0", 1 << 20, {"kind": "test"})
        with hung(old):
            for _ in range(3):
                tick(host)
            assert host.restarts == 1 and host._server is not old
            assert not producer.connected()  # hung up on, not left waiting for a reply
            assert answers(path)
        # The stuck coordinator wakes up and ends; its successor keeps its socket and its state.
        old._thread.join(10)
        assert not old._thread.is_alive()
        again = coordinator.AquaClient(path, name="prod", connect_timeout=2.0)
        again.lease("dep-prod", "cuda:0", 1 << 20, {"kind": "test"})
        host.refresh()
        assert host.device_states({"dep-prod": 0})[0].lent_bytes == 1 << 20
        assert host.restarts == 1
        producer.close()
        again.close()
    finally:
        host.stop()


def test_it_refuses_bad_probe_settings(tmp_path: Path) -> None:
    for kwargs in ({"probe_timeout_s": 0.0}, {"probe_timeout_s": float("nan")}, {"probe_failures": 0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            AquaHost(str(tmp_path / "aqua.sock"), **kwargs)


def test_it_starts_no_coordinator_when_stopped_during_a_restart(tmp_path: Path) -> None:
    # The agent's loop may stop the host while a telemetry tick's check, on a worker thread, is
    # restarting a hung coordinator: nothing may be left running.
    host = AquaHost(str(tmp_path / "aqua.sock"), probe_failures=1)  # default timeouts
    assert host.start() is True
    path = host.requested_socket
    old = host._server
    with hung(old):
        check = threading.Thread(target=host.refresh)
        check.start()
        wait_until(lambda: host._server is None, what="the hung coordinator being discarded")
        host.stop()  # while the check waits (stop_timeout_s) for the stuck one's thread
        check.join(10)
        assert not check.is_alive()
    assert host._server is None and host.socket_path is None and host.restarts == 0
    assert not answers(path) and not os.path.exists(path)
    old._thread.join(10)


LAG_LIMIT_S = 0.2  # how late a task on the agent's loop may wake while the coordinator is hung


def measure_loop_lag(lags: list[float]) -> asyncio.Task[None]:
    """A task on this loop that appends, every 50 ms, how much later than asked it woke."""

    async def measure() -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.05)
            lags.append(time.monotonic() - t0 - 0.05)

    return asyncio.create_task(measure())


@pytest.mark.asyncio
async def test_it_keeps_the_agent_loop_responsive_while_it_restarts_a_hung_coordinator(
    tmp_path: Path,
) -> None:
    server = ControlPlaneStub()
    await server.start()
    interval = 0.25
    # Default AquaHost timeouts: each probe waits 0.5 s, the restart 2 s for the stuck thread.
    host = LocalHost(CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=2)
    agent = Agent(
        host,
        server.url,
        "good-token",
        name="cpu-box",
        address="127.0.0.1",
        telemetry_interval_s=interval,
        backoff=Backoff(0.05, 0.2),
    )
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.link.connected and len(server.of_type("telemetry")) >= 2)
        aqua = host.aqua
        assert aqua is not None
        path, old = aqua.requested_socket, aqua._server
        lags: list[float] = []
        with hung(old):
            t_hung = time.monotonic()
            lagger = measure_loop_lag(lags)
            await wait_for(lambda: aqua.restarts == 1 and aqua._server is not None, timeout=15)
            lagger.cancel()
            t_restarted = time.monotonic()
            assert await asyncio.to_thread(answers, path)
        times = [t for t in server.times_of("telemetry") if t_hung <= t <= t_restarted]
        assert t_restarted - t_hung > 2.0  # probes and the restart took their (default) time ...
        assert max(lags) < LAG_LIMIT_S, f"the loop was held up {max(lags):.2f} s"  # ... off the loop
        gaps = [b - a for a, b in zip([t_hung, *times], [*times, t_restarted], strict=True)]
        assert max(gaps) < interval + LAG_LIMIT_S, gaps  # telemetry kept its cadence
        old._thread.join(10)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)
        await server.stop()


@pytest.mark.asyncio
async def test_it_stops_a_hung_coordinator_off_the_agent_loop(tmp_path: Path) -> None:
    # Stopping waits up to stop_timeout_s for a hung coordinator's thread; the loop (final
    # statuses to send, the link to close) must not wait with it.
    host = LocalHost(CpuInventory(), str(tmp_path), launcher=fake_launcher(tmp_path / "pids"), grace_s=2)
    await host.start(lambda status: None)
    aqua = host.aqua
    assert aqua is not None and aqua.stop_timeout_s >= 1.0  # the default, long enough to see
    lags: list[float] = []
    old = aqua._server
    assert old is not None
    with hung(old):
        lagger = measure_loop_lag(lags)
        t0 = time.monotonic()
        await host.stop()
        took = time.monotonic() - t0
        lagger.cancel()
    assert took >= aqua.stop_timeout_s * 0.9  # it did wait for the stuck thread ...
    assert max(lags) < LAG_LIMIT_S, f"the loop was held up {max(lags):.2f} s"  # ... off the loop
    assert aqua._server is None and aqua.socket_path is None
    old._thread.join(10)
