"""The lent store's watcher sends every free, off the store's lock: while a free waits on a slow or
hung coordinator, the engine's step (reserve/get/poll/discard) goes on, sees the region detached,
and allocates anew rather than reuse the allocation being freed; and a step whose discard lets a
reclaim finish returns without waiting for that free."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import pytest

from serving.aqua.coordinator import AquaClient, CoordinatorServer
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.offload.lent import LentRegionStore
from tests.aqua.conftest import hung, wait_until

NBYTES = 1 << 16
STEP_WAIT_S = 10.0  # generous: the step makes no round trip of the watcher's


@pytest.fixture
def lent(server: CoordinatorServer, sock_path: str) -> Iterator[tuple[AquaClient, Callable[[str], str]]]:
    """A producer client and `lend(producer_id)`, which leases a fresh shm region; its region id."""
    producer = AquaClient(sock_path, name="producer")
    regions: list[ShmRegion] = []

    def lend(producer_id: str) -> str:
        regions.append(ShmRegion.create(NBYTES))
        return producer.lease(producer_id, "cpu0", NBYTES, regions[-1].handle())

    yield producer, lend
    producer.close()
    for region in regions:
        region.close()


def allocations(server: CoordinatorServer) -> list[str]:
    """Live allocation ids at the coordinator."""
    return sorted(server.call(lambda c: list(c._allocs)))


def idle_allocation(store: LentRegionStore) -> str:
    """Have `store` allocate, then hold nothing (it keeps the allocation); its id."""
    assert store.reserve("req-1", 4096) is not None
    assert store._alloc is not None
    store.discard("req-1")
    assert store._alloc is not None and store.keys() == []
    return store._alloc.alloc_id


class HeldFree:
    """Stands in for a store's `client.free`: records the calling thread, then waits for `release`
    before the real free (a coordinator slow to take it)."""

    def __init__(self, store: LentRegionStore) -> None:
        self.real = store.client.free
        self.entered, self.release, self.sent = threading.Event(), threading.Event(), threading.Event()
        self.threads: list[str] = []

    def __call__(self, alloc_id: str, consumer_id: str | None = None) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.release.wait(60)
        self.real(alloc_id, consumer_id)
        self.sent.set()


def run_step(calls: Callable[[], None]) -> None:
    """Run `calls` as the engine's step, in its own thread; fail if it does not return in time."""
    step = threading.Thread(target=calls, name="engine-step", daemon=True)
    step.start()
    step.join(STEP_WAIT_S)
    assert not step.is_alive(), "the engine's step waited for the watcher's free"


def test_it_answers_the_step_and_allocates_anew_while_the_watchers_free_is_held_up(
    server: CoordinatorServer,
    sock_path: str,
    lent: tuple[AquaClient, Callable[[str], str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, lend = lent
    first = lend("p1")
    store = LentRegionStore(sock_path, "consumer", NBYTES, retry_seconds=0.0)
    free = HeldFree(store)
    monkeypatch.setattr(store.client, "free", free)
    try:
        held = idle_allocation(store)
        second = lend("p2")
        assert producer.request_reclaim(first) == "pending"
        # The watcher sees the reclaim of an idle store and gives the allocation back itself.
        assert free.entered.wait(STEP_WAIT_S), "the watcher did not free the reclaimed allocation"
        assert free.threads == ["aqua-lent-watch"]
        got: dict[str, object] = {}

        def step() -> None:
            got["poll"] = store.poll()
            got["get"] = store.get("req-1")
            store.discard("req-1")
            got["reserve"] = store.reserve("req-2", 4096)

        try:
            run_step(step)
            assert not free.sent.is_set()  # the free is still held up
            assert got["poll"] == [] and got["get"] is None  # the region is detached: nothing read
            assert got["reserve"] is not None  # a new allocation, in the region not reclaimed ...
            new = store._alloc
            assert new is not None and new.region_id == second and new.alloc_id != held
            assert allocations(server) == sorted([held, new.alloc_id])  # ... the old one not yet freed
        finally:
            free.release.set()
        assert free.sent.wait(STEP_WAIT_S), "the watcher's free was not sent"
        wait_until(lambda: producer.reclaim_status(first) == "done", STEP_WAIT_S, "the reclaim done")
        assert allocations(server) == [new.alloc_id]
        assert (store.allocations, store.releases) == (2, 1)
        assert store.get("req-2") is not None  # the new allocation is the store's
    finally:
        free.release.set()
        store.close()


def test_it_answers_the_step_while_the_watchers_free_waits_on_a_hung_coordinator(
    server: CoordinatorServer,
    sock_path: str,
    lent: tuple[AquaClient, Callable[[str], str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, lend = lent
    region = lend("p1")
    # A long call timeout: the free stays in flight for the whole step, however loaded the machine.
    store = LentRegionStore(sock_path, "consumer", NBYTES, call_timeout_s=60.0)
    in_flight, sent = threading.Event(), threading.Event()
    hang = contextlib.ExitStack()
    real_free = store.client.free

    def free_on_hung_coordinator(alloc_id: str, consumer_id: str | None = None) -> None:
        hang.enter_context(hung(server))  # the coordinator hangs as the free is sent
        in_flight.set()
        real_free(alloc_id, consumer_id)
        sent.set()

    monkeypatch.setattr(store.client, "free", free_on_hung_coordinator)
    try:
        held = idle_allocation(store)
        assert producer.request_reclaim(region) == "pending"
        assert in_flight.wait(STEP_WAIT_S), "the watcher did not free the reclaimed allocation"
        got: dict[str, object] = {}

        def step() -> None:
            got["poll"] = store.poll()
            got["get"] = store.get("req-1")
            store.discard("req-1")

        try:
            run_step(step)
            assert not sent.is_set()  # the coordinator has not answered the free
            assert got == {"poll": [], "get": None}
        finally:
            hang.close()
        assert sent.wait(STEP_WAIT_S), "the free was not answered once the coordinator ran again"
        assert held not in allocations(server)
        assert producer.reclaim_status(region) == "done" and store.releases == 1
    finally:
        hang.close()
        store.close()


def test_a_poll_that_finds_an_idle_allocation_under_reclaim_leaves_its_free_to_the_watcher(
    server: CoordinatorServer,
    sock_path: str,
    lent: tuple[AquaClient, Callable[[str], str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # poll() runs on every engine step and makes no round trip (module docstring), also when the
    # reclaim it sees has nothing to evacuate: the watcher frees that allocation in its next pass.
    producer, lend = lent
    region = lend("p1")
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    noticed, go = threading.Event(), threading.Event()
    free = HeldFree(store)
    free.release.set()  # the coordinator takes frees at once here
    real_check = store._check_reclaim

    def check_then_hold() -> None:  # the watcher, paused between noticing the reclaim and freeing
        real_check()
        if store._reclaiming and not noticed.is_set():
            noticed.set()
            go.wait(STEP_WAIT_S)

    monkeypatch.setattr(store.client, "free", free)
    monkeypatch.setattr(store, "_check_reclaim", check_then_hold)
    try:
        held = idle_allocation(store)
        assert producer.request_reclaim(region) == "pending"
        assert noticed.wait(STEP_WAIT_S), "the watcher did not notice the reclaim"
        try:
            assert store.poll() == []  # the engine's step: nothing to evacuate
            assert free.threads == [] and held in allocations(server)
        finally:
            go.set()
        wait_until(lambda: producer.reclaim_status(region) == "done", STEP_WAIT_S, "the reclaim done")
        assert free.threads == ["aqua-lent-watch"] and store.releases == 1
    finally:
        go.set()
        store.close()


def test_a_discard_that_lets_a_reclaim_finish_leaves_the_free_to_the_watcher(
    server: CoordinatorServer,
    sock_path: str,
    lent: tuple[AquaClient, Callable[[str], str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The engine evacuates the last stored key of a reclaimed region and discards it, in its step:
    # the free that lets the producer's reclaim finish is the watcher's round trip, not the step's.
    producer, lend = lent
    region = lend("p1")
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    free = HeldFree(store)
    monkeypatch.setattr(store.client, "free", free)
    try:
        assert store.reserve("req-1", 4096) is not None
        assert producer.request_reclaim(region) == "pending"
        wait_until(lambda: store.poll() == ["req-1"], STEP_WAIT_S, "the reclaim handed to the engine")
        try:
            run_step(lambda: store.discard("req-1"))  # evacuated: the last key goes
            assert store.keys() == [] and store.get("req-1") is None  # detached at once
            assert free.entered.wait(STEP_WAIT_S), "the watcher did not send the free"
            assert free.threads == ["aqua-lent-watch"]
        finally:
            free.release.set()
        wait_until(lambda: producer.reclaim_status(region) == "done", STEP_WAIT_S, "the reclaim done")
        assert allocations(server) == [] and store.releases == 1
    finally:
        free.release.set()
        store.close()
