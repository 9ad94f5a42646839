"""An engine step's own `allocate` in the lent store (first allocation, or trading a small piece
up) never waits behind the watcher's round trip on the shared client: with a call in flight
(the watcher's `pending_reclaims` or a queued free, on a slow coordinator) the save goes to the
next tier at once, and the next `reserve` tries again. Waiting would cost the step up to two call
timeouts: the watcher's and then its own."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from serving.aqua.coordinator import CoordinatorServer
from serving.aqua.offload.lent import LentRegionStore
from serving.aqua.producer import LenderAgent
from tests.aqua.conftest import hung, spy_on_pending_reclaims, wait_until

SMALL, NBYTES = 1 << 14, 1 << 16
SLOW_S = 60.0  # the call timeout: a step that waited for the watcher's reply would wait this long
JOIN_S = 20.0  # bounds a step that would wait (the assertion is on whether it returned, not when)


def reserve_from_another_thread(store: LentRegionStore, key: str, nbytes: int) -> list[Any]:
    """`store.reserve` on a thread of its own (the engine's step); [] if it has not returned."""
    got: list[Any] = []
    step = threading.Thread(target=lambda: got.append(store.reserve(key, nbytes)), daemon=True)
    step.start()
    step.join(JOIN_S)
    return got


def test_a_trade_up_does_not_wait_for_the_watchers_call_on_a_slow_coordinator(
    server: CoordinatorServer, sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = LenderAgent(sock_path, "cpu0", SMALL, producer_id="small")
    small.lend()
    store = LentRegionStore(sock_path, "cons", NBYTES, retry_seconds=0.05, call_timeout_s=SLOW_S)
    large = None
    try:
        assert store.reserve("req-1", 4096) is not None
        assert store._alloc is not None and store._alloc.nbytes == SMALL  # the largest piece lent
        store.discard("req-1")  # empty: the next reserve trades the piece up
        large = LenderAgent(sock_path, "cpu1", NBYTES, producer_id="large")
        large.lend()
        client = store._alloc_client
        assert client is not None
        asked = spy_on_pending_reclaims(client, monkeypatch)
        with hung(server):
            asked.clear()
            assert asked.wait(5)  # the watcher's next pending_reclaims, sent now: no reply comes
            wait_until(client._lock.locked, 5, "the watcher's call in flight")
            got = reserve_from_another_thread(store, "req-2", 4096)
            assert got, "the step waited for the watcher's reply"
            assert got[0] is not None  # the small piece still serves this save
            assert client._lock.locked()  # the watcher still waits: the step did not
            assert store.allocations == 1 and store.sessions_lost == 0
        store.discard("req-2")
        wait_until(lambda: not client._lock.locked(), 10, "the watcher's reply")
        traded = lambda: store.reserve("req-3", 4096) is not None and store.allocations == 2  # noqa: E731
        wait_until(traded, 10, "the trade up")
        assert store._alloc is not None and store._alloc.nbytes == NBYTES
    finally:
        store.close()
        small.close()
        if large is not None:
            large.close()


def test_a_first_allocate_with_a_call_in_flight_goes_to_the_next_tier_and_retries_on_the_next_save(
    server: CoordinatorServer, sock_path: str
) -> None:
    lender = LenderAgent(sock_path, "cpu0", NBYTES, producer_id="prod")
    lender.lend()
    # retry_seconds long: a save refused for a call in flight must not use up the next attempt
    store = LentRegionStore(sock_path, "cons", NBYTES, retry_seconds=3600, call_timeout_s=SLOW_S)
    try:
        client = store.client
        with client._lock:  # as the watcher's free, waiting for its reply, holds it
            got = reserve_from_another_thread(store, "req-1", 4096)
            assert got, "the step waited for another thread's call"
            assert got == [None] and store.allocations == 0  # the next tier takes this save
        assert store.reserve("req-1", 4096) is not None
        assert store.allocations == 1
    finally:
        store.close()
        lender.close()
