"""Lending across a coordinator restart: the agent stops its coordinator (every session ends, so
clients see CoordinatorUnavailable) and starts a fresh, empty one on the same socket path.

Consumers (the KV connector's `LentRegionStore`) must drop what they held in lent memory (recompute,
never a read of memory the coordinator may have handed on), keep working on DRAM while the
coordinator is down without stalling the step loop, and use lent memory again once a producer lends
to the new coordinator. Producers (`LenderAgent`) must lend again to the new coordinator, in fresh
memory: the old memory may still be mapped by a consumer that has not yet noticed.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import serving.aqua.coordinator.client as client_module
from serving.aqua.coordinator import AquaClient, CoordinatorServer
from serving.aqua.memory import ShmRegion, open_region
from serving.aqua.offload.lent import LentRegionStore
from serving.aqua.producer import LenderAgent
from tests.aqua.conftest import REPO, wait_until

NBYTES = 1 << 16
STEP_BUDGET_S = 0.1  # what one store call may take while the coordinator is down


class Host:
    """The coordinator the way the GPU agent runs it: in-process, restarted on the same path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.server: CoordinatorServer | None = None

    def start(self) -> None:
        self.server = CoordinatorServer(self.path)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()  # closes every session first, as the agent's restart does
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def regions(self) -> list[dict[str, Any]]:
        assert self.server is not None
        regions: list[dict[str, Any]] = self.server.call(lambda c: c.stats()["regions"])
        return regions


def count_connects(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times of every connection attempt a client makes from now on (monotonic)."""
    attempts: list[float] = []
    real_connect = client_module._connect

    def counted(path: str, timeout: float) -> Any:
        attempts.append(time.monotonic())
        return real_connect(path, timeout)

    monkeypatch.setattr(client_module, "_connect", counted)
    return attempts


@pytest.fixture
def host(sock_path: str) -> Iterator[Host]:
    h = Host(sock_path)
    h.start()
    yield h
    h.stop()


@pytest.fixture
def agent(host: Host) -> Iterator[LenderAgent]:
    """An in-process producer lending one shared-memory region."""
    a = LenderAgent(host.path, "cpu0", NBYTES, producer_id="prod")
    a.lend()
    yield a
    a.close()


def make_store(path: str, retry_seconds: float = 0.05) -> LentRegionStore:
    return LentRegionStore(path, "cons", NBYTES, retry_seconds=retry_seconds)


def store_pattern(store: LentRegionStore, key: str, seed: int) -> torch.Tensor:
    buf = store.reserve(key, 4096)
    assert buf is not None, "the store should hand out lent memory"
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    buf.copy_(data)
    return data


def lend_again(store: LentRegionStore, key: str, timeout: float = 10.0) -> torch.Tensor:
    """Call `reserve` the way the engine's steps do until the store lends again; the buffer."""
    got: list[torch.Tensor] = []

    def attempt() -> bool:
        store.poll()
        buf = store.reserve(key, 4096)
        if buf is not None:
            got.append(buf)
        time.sleep(0.01)
        return bool(got)

    wait_until(attempt, timeout, "the store to use lent memory again")
    return got[0]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def shm_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------------------------- consumer
def test_it_drops_lent_kv_when_the_coordinator_restarts_and_never_reads_the_old_region(
    host: Host, agent: LenderAgent
) -> None:
    store = make_store(host.path)
    try:
        store_pattern(store, "req-1", seed=1)
        host.restart()
        assert store.poll() == []  # nothing to evacuate: those bytes are no longer ours
        assert store.get("req-1") is None  # the request recomputes
        assert store.keys() == []
        assert store._region is None  # the old mapping is detached
        assert store.reserve("req-2", 4096) is None  # nothing is lent by the new coordinator yet
        assert store.sessions_lost == 1
    finally:
        store.close()


def test_it_notices_a_lost_session_on_get_before_any_step_poll(host: Host, agent: LenderAgent) -> None:
    store = make_store(host.path)
    try:
        store_pattern(store, "req-1", seed=1)
        store._stop.set()  # no watcher: only the calls a load makes
        store._watcher.join()
        host.restart()
        assert store.get("req-1") is None
    finally:
        store.close()


def test_it_lends_again_once_a_producer_leases_with_the_new_coordinator(
    host: Host, agent: LenderAgent
) -> None:
    store = make_store(host.path)
    try:
        store_pattern(store, "req-1", seed=1)
        host.restart()
        assert store.poll() == [] and store.get("req-1") is None
        with ShmRegion.create(NBYTES) as memory, AquaClient(host.path, name="prod-2") as producer:
            producer.lease("prod-2", "cpu0", NBYTES, memory.handle())
            buf = lend_again(store, "req-2")
            data = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
            buf.copy_(data)
            got = store.get("req-2")
            assert got is not None and torch.equal(got, data)
            (region,) = host.regions()
            assert region["consumer_id"] == "cons" and region["producer_id"] == "prod-2"
            store.close()  # gives the allocation back before the producer's memory goes
    finally:
        store.close()


def test_it_starts_without_a_coordinator_and_lends_once_one_is_up(sock_path: str) -> None:
    t0 = time.monotonic()
    store = make_store(sock_path)  # e.g. the engine starts while the agent restarts its coordinator
    host = Host(sock_path)
    agent = None
    try:
        assert time.monotonic() - t0 < 1.0
        assert store.reserve("req-1", 4096) is None  # DRAM meanwhile
        host.start()
        agent = LenderAgent(sock_path, "cpu0", NBYTES, producer_id="prod")
        agent.lend()
        lend_again(store, "req-1")
    finally:
        store.close()
        if agent is not None:
            agent.close()
        host.stop()


def test_its_calls_fail_fast_and_it_backs_off_while_the_coordinator_is_down(
    host: Host, agent: LenderAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(host.path)
    attempts = count_connects(monkeypatch)
    try:
        store_pattern(store, "req-1", seed=1)
        host.stop()  # down, not yet restarted
        slowest = 0.0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:  # engine steps every 5 ms
            slowest = max(
                slowest,
                timed(store.poll),
                timed(lambda: store.reserve("req-2", 4096)),
                timed(lambda: store.get("req-1")),
                timed(lambda: store.discard("req-2")),
            )
            time.sleep(0.005)
        assert slowest < STEP_BUDGET_S
        assert 1 <= len(attempts) <= 6, f"{len(attempts)} connection attempts in 1.5 s"
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        assert gaps == sorted(gaps), f"attempts should back off, gaps {gaps}"
    finally:
        store.close()


# ------------------------------------------------------------------------------------- producer
def test_the_lender_leases_fresh_memory_with_the_new_coordinator(host: Host, agent: LenderAgent) -> None:
    assert agent.region is not None
    old_name = agent.region.handle()["name"]
    host.restart()
    assert host.regions() == []
    assert agent.keep_lent() is True
    (region,) = host.regions()
    assert region["producer_id"] == "prod" and region["nbytes"] == NBYTES
    assert region["region_id"] == agent.region_id
    assert agent.region.handle()["name"] != old_name  # fresh memory ...
    assert not shm_exists(old_name)  # ... and the old segment is released
    assert agent.keep_lent() is True and len(host.regions()) == 1  # no second lease while lending


def test_a_consumer_that_missed_the_restart_cannot_touch_memory_lent_again(
    host: Host, agent: LenderAgent
) -> None:
    with AquaClient(host.path) as stale:
        old = stale.allocate("stale", 4096)
        assert old is not None
        stale_region = open_region(old.handle)
        host.restart()
        assert agent.keep_lent() is True
        with AquaClient(host.path) as fresh:
            new = fresh.allocate("fresh", 4096)
            assert new is not None
            fresh_region = open_region(new.handle)
            fresh_region.write(new.offset, b"F" * 4096)
            # The stale consumer still writes where it was told to before the restart ...
            stale_region.write(old.offset, b"S" * 4096)
            # ... which is no longer memory anyone is lent.
            assert bytes(fresh_region.view(new.offset, 4096)) == b"F" * 4096
            fresh_region.close()
        stale_region.close()


def test_the_lender_stops_lending_while_the_coordinator_is_down_and_backs_off(
    host: Host, agent: LenderAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert agent.region is not None
    old_name = agent.region.handle()["name"]
    attempts = count_connects(monkeypatch)
    host.stop()
    t0 = time.monotonic()
    slowest = 0.0
    while time.monotonic() - t0 < 1.5:
        slowest = max(slowest, timed(agent.keep_lent))
        time.sleep(0.005)
    assert slowest < STEP_BUDGET_S
    assert agent.region is None and agent.region_id is None and not shm_exists(old_name)
    assert 1 <= len(attempts) <= 6, f"{len(attempts)} connection attempts in 1.5 s"
    host.start()
    wait_until(agent.keep_lent, 15.0, "the lender to lease again")
    assert len(host.regions()) == 1


class LenderProcess:
    """`python -m serving.aqua.producer` with its events read on a thread (a missing one fails the
    test after a timeout instead of hanging it)."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "serving.aqua.producer", "--socket", path, "--nbytes", str(NBYTES)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next_event(self, timeout: float = 10.0) -> dict[str, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event from the lender within {timeout}s") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_the_lender_process_lends_again_after_a_restart_then_reclaims_cleanly(host: Host) -> None:
    lender = LenderProcess(host.path)
    proc, next_event = lender.proc, lender.next_event
    try:
        first = next_event()
        assert first["event"] == "leased"
        host.restart()
        assert next_event() == {"event": "withdrawn", "region_id": first["region_id"]}
        again = next_event()
        assert again["event"] == "leased" and again["handle"]["name"] != first["handle"]["name"]
        assert not shm_exists(first["handle"]["name"])
        with AquaClient(host.path) as consumer:
            a = consumer.allocate("c1", 4096)
            assert a is not None and a.handle == again["handle"]
            proc.send_signal(signal.SIGUSR1)
            assert next_event()["event"] == "reclaiming"
            wait_until(lambda: consumer.pending_reclaims("c1") != [], 5.0, "the reclaim")
            consumer.free(a.alloc_id)
            assert next_event()["clean"] is True
        assert proc.wait(10) == 0
        assert not shm_exists(again["handle"]["name"])
    finally:
        lender.close()


def test_the_lender_process_releases_its_memory_if_the_coordinator_is_gone_at_reclaim(host: Host) -> None:
    lender = LenderProcess(host.path)
    proc, next_event = lender.proc, lender.next_event
    try:
        leased = next_event()
        host.stop()
        assert next_event()["event"] == "withdrawn"
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(10) == 0  # nothing was lent any more: nothing to wait for
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
        assert not shm_exists(leased["handle"]["name"])
    finally:
        lender.close()


# ------------------------------------------------------------------------------------- leaks
def test_nothing_leaks_across_restarts(host: Host) -> None:
    fds = open_fds()
    agent = LenderAgent(host.path, "cpu0", NBYTES, producer_id="prod")
    agent.lend()
    store = make_store(host.path)
    names = []
    try:
        for i in range(3):
            assert agent.region is not None
            names.append(agent.region.handle()["name"])
            store_pattern(store, f"req-{i}", seed=i)
            host.restart()
            assert store.poll() == [] and store.get(f"req-{i}") is None
            assert agent.keep_lent() is True
            lend_again(store, f"req-{i}-again")
            store.discard(f"req-{i}-again")
    finally:
        store.close()
        agent.close()
    assert [n for n in names if shm_exists(n)] == []
    wait_until(lambda: open_fds() <= fds, 5.0, "the sockets to close")
