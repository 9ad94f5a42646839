"""A coordinator that listens but never answers (hung loop, or a silent socket) must not hold the
engine's step for the client's 30 s reply timeout: the KV store's calls give up after its short
`call_timeout_s`, the session is then over (its allocations with it), the engine uses DRAM, and no
lent memory whose allocation was never confirmed is handed out or read.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from serving.aqua.coordinator import AquaClient, CoordinatorServer, CoordinatorUnavailable
from serving.aqua.offload.dram import DramStore
from serving.aqua.offload.lent import CALL_TIMEOUT_S, LentRegionStore
from serving.aqua.offload.store import KVStore
from serving.aqua.producer import LenderAgent
from serving.vllm_ext.offload_config import OffloadConfig
from tests.aqua.conftest import hung, silent_listener, wait_until

NBYTES = 1 << 16
TIMEOUT_S = 0.3  # the store's call timeout in these tests
STEP_LIMIT_S = TIMEOUT_S + 0.5  # what one step call may take, with room for a loaded machine


@pytest.fixture
def lender(server: CoordinatorServer, sock_path: str) -> Iterator[LenderAgent]:
    agent = LenderAgent(sock_path, "cpu0", NBYTES, producer_id="prod")
    agent.lend()
    yield agent
    agent.close()


def make_store(path: str) -> LentRegionStore:
    return LentRegionStore(path, "cons", NBYTES, retry_seconds=0.05, call_timeout_s=TIMEOUT_S)


def pattern(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def save(tiers: list[KVStore], key: str, data: torch.Tensor) -> str:
    """Offload `data` the way the connector's worker does: the first tier with room; its name."""
    for tier in tiers:
        buf = tier.reserve(key, data.numel())
        if buf is not None:
            buf.copy_(data)
            return tier.tier
    raise AssertionError("no tier had room")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.monotonic()
    result = fn()
    return time.monotonic() - t0, result


def allocations(server: CoordinatorServer) -> list[str]:
    """Live allocation ids at the coordinator."""
    return sorted(server.call(lambda c: list(c._allocs)))


def test_a_silent_coordinator_costs_the_engine_no_more_than_the_call_timeout(sock_path: str) -> None:
    with silent_listener(sock_path) as accepted:
        elapsed, store = timed(lambda: make_store(sock_path))  # engine start: one hello, unanswered
        dram = DramStore(1 << 20, pin=False)
        try:
            assert elapsed < STEP_LIMIT_S
            assert store._session.current() is None  # the hello went unanswered
            slowest, tiers_used = 0.0, set[str]()
            t0 = time.monotonic()
            step = 0
            while time.monotonic() - t0 < 1.5:  # engine steps while the watcher keeps retrying
                step += 1
                data = pattern(step)
                for fn in (store.poll, dram.poll):
                    slowest = max(slowest, timed(fn)[0])
                took, tier = timed(lambda: save([store, dram], f"req-{step}", data))  # noqa: B023
                slowest, tiers_used = max(slowest, took), tiers_used | {tier}
                stored = dram.get(f"req-{step}")
                assert stored is not None and torch.equal(stored, data)
                dram.discard(f"req-{step}")
                time.sleep(0.005)
            assert slowest < STEP_LIMIT_S
            assert tiers_used == {"dram"} and store.keys() == []
            assert 2 <= len(accepted) <= 6, f"{len(accepted)} connection attempts: no backoff?"
        finally:
            store.close()
            dram.close()


def test_an_allocate_left_unanswered_returns_within_the_timeout_and_its_memory_is_never_used(
    server: CoordinatorServer, lender: LenderAgent, sock_path: str
) -> None:
    store = make_store(sock_path)
    dram = DramStore(1 << 20, pin=False)
    try:
        with hung(server):
            took, buf = timed(lambda: store.reserve("req-1", 4096))  # the step's first allocate
            assert buf is None and took < STEP_LIMIT_S
            assert store._region is None and store._alloc is None  # nothing unconfirmed is mapped
            assert store._session.current() is None  # the session is over
            for i in range(5):  # steps while it stays hung: DRAM, at once
                took, tier = timed(lambda: save([store, dram], f"req-{i}", pattern(i)))  # noqa: B023
                assert tier == "dram" and took < STEP_LIMIT_S
        # The coordinator runs again: the allocate it may have made died with the session, and the
        # store allocates anew on a new session (never sending the old session's ids).
        wait_until(lambda: store.reserve("req-9", 4096) is not None, 10, "lent memory again")
        assert store._alloc is not None
        assert allocations(server) == [store._alloc.alloc_id]
        assert store._session.sessions_opened == 2
    finally:
        store.close()
        dram.close()


def test_a_coordinator_that_hangs_while_lending_costs_a_step_at_most_the_timeout(
    server: CoordinatorServer, lender: LenderAgent, sock_path: str
) -> None:
    store = make_store(sock_path)
    dram = DramStore(1 << 20, pin=False)
    data = pattern(1)
    try:
        assert save([store, dram], "req-1", data) == "lent"
        with hung(server):
            slowest, reads = 0.0, []
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.5:  # steps while the watcher's calls go unanswered
                for fn in (store.poll, lambda: store.discard("req-2")):
                    slowest = max(slowest, timed(fn)[0])
                took, got = timed(lambda: store.get("req-1"))
                slowest = max(slowest, took)
                reads.append(None if got is None else torch.equal(got, data))
                took, tier = timed(lambda: save([store, dram], "req-2", pattern(2)))
                slowest = max(slowest, took)
                time.sleep(0.005)
            assert slowest < STEP_LIMIT_S
            # The confirmed allocation's data until the session was seen to be broken; nothing after.
            assert reads[-1] is None
            first_miss = reads.index(None)
            assert all(r is True for r in reads[:first_miss]) and all(r is None for r in reads[first_miss:])
            assert store._region is None and store.sessions_lost == 1
            assert tier == "dram"
        wait_until(lambda: store.reserve("req-3", 4096) is not None, 10, "lent memory again")
        assert store._alloc is not None
        assert allocations(server) == [store._alloc.alloc_id]  # the old one was freed by its disconnect
    finally:
        store.close()
        dram.close()


def test_a_hung_server_stop_hangs_up_its_clients_and_spares_a_successors_socket(
    server: CoordinatorServer, sock_path: str
) -> None:
    client = AquaClient(sock_path, timeout=30.0)
    with hung(server) as release:
        took, stopped = timed(lambda: server.stop(timeout=0.3))
        assert stopped is False and took < 2.0
        wait_until(lambda: not client.connected(), 2.0, "the client to be hung up on")
        os.unlink(sock_path)  # what the host agent does before it starts a new coordinator
        successor = CoordinatorServer(sock_path)
        successor.start()
        release.set()  # the stuck coordinator wakes up and ends ...
        assert server._thread is not None
        server._thread.join(10)
    try:
        assert not server._thread.is_alive()
        assert os.path.exists(sock_path)  # ... without removing its successor's socket
        with AquaClient(sock_path, timeout=2.0) as again:
            again.ping()
    finally:
        successor.stop()
    client.close()


def test_connecting_to_a_listener_with_a_full_backlog_fails_instead_of_blocking(sock_path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(0)  # accepts nothing: the backlog fills up
    queued = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(sock_path)
        except BlockingIOError:
            s.close()
            break
        queued.append(s)
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            AquaClient(sock_path, timeout=0.3, connect_timeout=0.2)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(5)
    try:
        assert outcome, "the connection attempt blocked"
        assert isinstance(outcome[0], CoordinatorUnavailable)
    finally:
        for s in queued:
            s.close()
        listener.close()


def test_the_connector_option_for_the_call_timeout_is_validated() -> None:
    assert OffloadConfig().coordinator_timeout_s == CALL_TIMEOUT_S
    assert OffloadConfig.from_extra({"coordinator_timeout_s": 0.25}).coordinator_timeout_s == 0.25
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="coordinator_timeout_s"):
            OffloadConfig(coordinator_timeout_s=bad)
    with pytest.raises(ValueError, match="call_timeout_s"):
        LentRegionStore("/nonexistent/aqua.sock", "cons", NBYTES, call_timeout_s=0)


def test_a_lenders_reclaim_gives_up_on_a_hung_coordinator_after_its_call_timeout(
    server: CoordinatorServer, sock_path: str
) -> None:
    # The producer's calls used the client's 30 s reply timeout: a reclaim asked of a hung
    # coordinator held the producer that long, whatever its --reclaim-timeout.
    agent = LenderAgent(sock_path, "cpu0", NBYTES, producer_id="prod", call_timeout=TIMEOUT_S)
    agent.lend()
    try:
        with hung(server):
            t0 = time.monotonic()
            clean = agent.reclaim(timeout=TIMEOUT_S)
            took = time.monotonic() - t0
        assert clean is False  # not given back: the session ended, the lease is withdrawn
        assert took < STEP_LIMIT_S + TIMEOUT_S, f"reclaim took {took:.1f} s"
        assert agent.region is None and agent.region_id is None  # its memory released
    finally:
        agent.close()
