"""The agent's liveness check of its hosted Aqua coordinator: a coordinator whose thread died with
its socket file left, or whose loop hangs (connections accepted, never answered), is restarted
after `probe_failures` failed probes in a row; a healthy one never is."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import pytest

from gpu_agent.aqua import AquaHost
from tests.aqua.conftest import hung

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
    stats = host.stats()
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
