"""The agent's Aqua seam: the real coordinator server in-process, its stats as device telemetry."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_agent.aqua import AquaDeviceState, AquaHost, device_states

coordinator = pytest.importorskip("serving.aqua.coordinator", reason="serving.aqua.coordinator not present")


def test_it_maps_regions_and_allocations_to_roles_bytes_and_pairings() -> None:
    stats = {
        "regions": [
            {
                "region_id": "r1",
                "producer_id": "prod",
                "device": "cuda:0",
                "nbytes": 1000,
                "allocated_bytes": 300,
                "consumer_id": "cons",
            },
            {
                "region_id": "r2",
                "producer_id": "idle",
                "device": "cuda:5",
                "nbytes": 50,
                "allocated_bytes": 0,
                "consumer_id": None,
            },
            {
                "region_id": "r3",
                "producer_id": "stranger",
                "device": "weird",
                "nbytes": 7,
                "allocated_bytes": 0,
                "consumer_id": None,
            },
        ]
    }
    # "cons" runs on device 3; "idle" is unknown to the agent, so its device string is used.
    states = device_states(stats, {"prod": 2, "cons": 3})
    assert states == {
        2: AquaDeviceState("producer", lent_bytes=1000, borrowed_bytes=0, paired_with=3),
        3: AquaDeviceState("consumer", lent_bytes=0, borrowed_bytes=300, paired_with=2),
        5: AquaDeviceState("producer", lent_bytes=50, borrowed_bytes=0, paired_with=None),
    }
    assert device_states({"regions": []}, {}) == {}


def test_it_hosts_the_real_coordinator_and_reports_lending(tmp_path: Path) -> None:
    host = AquaHost(str(tmp_path / "aqua.sock"))
    assert host.socket_path is None and host.stats() is None
    assert host.start() is True
    try:
        assert host.socket_path == str(tmp_path / "aqua.sock")
        producer = coordinator.AquaClient(host.socket_path, name="prod")
        consumer = coordinator.AquaClient(host.socket_path, name="cons")
        producer.lease("dep-prod", "cuda:0", 1 << 20, {"kind": "test"})
        alloc = consumer.allocate("dep-cons", 64 * 1024)
        assert alloc is not None
        host.refresh()  # a telemetry tick
        states = host.device_states({"dep-prod": 0, "dep-cons": 1})
        assert states[0].role == "producer" and states[0].lent_bytes == 1 << 20 and states[0].paired_with == 1
        assert states[1].role == "consumer" and states[1].borrowed_bytes == 64 * 1024
        consumer.free(alloc.alloc_id)
        host.refresh()
        states = host.device_states({"dep-prod": 0, "dep-cons": 1})
        assert states[0].borrowed_bytes == 0 and 1 not in states
        producer.close()
        consumer.close()
    finally:
        host.stop()
    assert not (tmp_path / "aqua.sock").exists()


def test_engines_get_the_socket_even_when_the_first_start_failed(tmp_path: Path) -> None:
    # The launcher reads the path once, at host start: a coordinator that comes up on a later
    # tick must still be reachable by the engines started meanwhile.
    blocker = tmp_path / "state"
    blocker.write_text("a file where the socket's directory should be")
    path = str(blocker / "aqua.sock")
    host = AquaHost(path)
    assert host.start() is False
    assert host.socket_path == path
    blocker.unlink()
    host.refresh()  # the next telemetry tick starts it
    try:
        assert host.restarts == 1 and host._server is not None
        client = coordinator.AquaClient(path, name="late", connect_timeout=2.0)
        client.close()
    finally:
        host.stop()
    assert host.socket_path is None
