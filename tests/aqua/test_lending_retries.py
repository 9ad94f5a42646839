"""Review of lending by pieces: a region the consumer cannot attach is passed over (exclude_regions),
a piece smaller than lent_bytes is traded up when the store is empty, and the fallback for older
coordinators drops only the arguments they refuse, only on their session."""

from __future__ import annotations

import time
from typing import Any

import pytest

from serving.aqua.coordinator import AquaClient, Coordinator, CoordinatorServer, InvalidArgument
from serving.aqua.coordinator import server as server_module
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.offload import lent as lent_module
from serving.aqua.offload.lent import LentRegionStore
from tests.aqua.conftest import wait_until

MIB = 1 << 20
GONE = {"kind": "shm", "name": "aqua-test-no-such-segment"}  # leased, never attachable
BEFORE_MIN = frozenset({"consumer_id", "nbytes", "device_hint"})  # allocate before min_nbytes
BEFORE_EXCLUDE = BEFORE_MIN | {"min_nbytes"}  # allocate before exclude_regions


def _regions(server: CoordinatorServer) -> list[tuple[str, str | None, int]]:
    return [
        (r["region_id"], r["consumer_id"], r["allocated_bytes"])
        for r in server.call(lambda c: c.stats())["regions"]
    ]


def test_the_coordinator_passes_over_excluded_regions_for_whole_and_partial_requests() -> None:
    c = Coordinator()
    first = c.lease("p1", "cpu0", 8 * MIB, GONE)
    second = c.lease("p2", "cpu0", 2 * MIB, GONE)
    got = c.allocate("eng", MIB, exclude_regions=[first, "r999"])  # unknown ids are ignored
    assert got is not None and got.region_id == second
    assert c.allocate("eng", 64 * MIB, min_nbytes=MIB, exclude_regions=[first, second]) is None
    piece = c.allocate("eng", 64 * MIB, min_nbytes=MIB, exclude_regions=[first])
    assert piece is not None and (piece.region_id, piece.nbytes) == (second, MIB)
    for bad in ("r1", [""], [1], {"r1": 1}):
        with pytest.raises(InvalidArgument, match="exclude_regions"):
            c.allocate("eng", MIB, exclude_regions=bad)  # type: ignore[arg-type]
    c.check_invariants()


def test_a_client_excludes_regions_over_the_wire(server: CoordinatorServer, sock_path: str) -> None:
    with AquaClient(sock_path, name="p") as producer, AquaClient(sock_path, name="c") as consumer:
        first = producer.lease("p", "cpu0", MIB, GONE)
        second = producer.lease("p", "cpu0", MIB, GONE)
        got = consumer.allocate("eng", 4096, exclude_regions=[first])
        assert got is not None and got.region_id == second


def test_it_uses_a_later_region_when_the_first_in_lease_order_cannot_be_attached(
    server: CoordinatorServer, sock_path: str
) -> None:
    memory = ShmRegion.create(MIB)
    producer = AquaClient(sock_path, name="producer")
    bad = producer.lease("broken", "cpu0", MIB, GONE)
    good = producer.lease("good", "cpu0", MIB, memory.handle())
    store = LentRegionStore(sock_path, "engine", MIB, retry_seconds=0.0)
    try:
        assert store.reserve("req-1", 4096) is not None
        want = [(bad, None, 0), (good, "engine", MIB)]  # the unattachable one freed by the watcher
        wait_until(lambda: _regions(server) == want, 10.0, "the unattachable allocation freed")
    finally:
        store.close()
        producer.close()
        memory.close()


def test_it_tries_an_unattachable_region_again_after_a_while(
    server: CoordinatorServer, sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lent_module, "ATTACH_RETRY_S", 0.2)
    producer = AquaClient(sock_path, name="producer")
    bad = producer.lease("broken", "cpu0", MIB, GONE)
    store = LentRegionStore(sock_path, "engine", MIB, retry_seconds=0.0)
    seen: list[list[str]] = []
    real = store.client.allocate

    def allocate(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("exclude_regions", []))
        return real(*args, **kwargs)

    monkeypatch.setattr(store.client, "allocate", allocate)
    try:
        assert store.reserve("req-1", 4096) is None
        assert seen == [[], [bad]]  # tried once, then passed over (nothing else to lend: None)
        time.sleep(0.25)
        seen.clear()
        assert store.reserve("req-1", 4096) is None
        assert seen[0] == []  # its time is up: tried again (the producer may have fixed it)
    finally:
        store.close()
        producer.close()


def test_a_zero_byte_reserve_does_not_make_it_think_the_coordinator_is_old(
    server: CoordinatorServer, sock_path: str
) -> None:
    memory = ShmRegion.create(MIB)
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cpu0", MIB, memory.handle())
    store = LentRegionStore(sock_path, "engine", 64 * MIB, retry_seconds=0.0)
    try:
        with pytest.raises(ValueError):  # refused before any round trip
            store.reserve("empty", 0)
        assert store.reserve("req-1", 4096) is not None  # still asks for a piece of what is lent
    finally:
        store.close()
        producer.close()
        memory.close()


def test_it_keeps_min_nbytes_with_a_coordinator_that_only_lacks_exclude_regions(
    server: CoordinatorServer, sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "OPS", dict(server_module.OPS, allocate=BEFORE_EXCLUDE))
    memory = ShmRegion.create(MIB)
    producer = AquaClient(sock_path, name="producer")
    bad = producer.lease("broken", "cpu0", MIB, GONE)
    good = producer.lease("good", "cpu0", MIB, memory.handle())
    store = LentRegionStore(sock_path, "engine", 64 * MIB, retry_seconds=0.0)
    try:
        # That coordinator cannot pass over the broken region, first in lease order; but the store
        # still holds it when it asks again (its free waits for the watcher), so it gets the other
        # region, and a piece of it: min_nbytes was kept.
        assert store.reserve("req-1", 4096) is not None
        assert store._refused_args == {"exclude_regions"}
        want = [(bad, None, 0), (good, "engine", MIB)]
        wait_until(lambda: _regions(server) == want, 10.0, "the unattachable allocation freed")
    finally:
        store.close()
        producer.close()
        memory.close()


def test_it_asks_a_restarted_coordinator_for_pieces_again(sock_path: str) -> None:
    """An older coordinator refused min_nbytes; the agent restarts a newer one on the same socket."""
    old = CoordinatorServer(sock_path)
    ops = server_module.OPS
    server_module.OPS = dict(ops, allocate=BEFORE_MIN)
    old.start()
    store = LentRegionStore(sock_path, "engine", 64 * MIB, retry_seconds=0.0)
    memory = ShmRegion.create(MIB)
    new: CoordinatorServer | None = None
    try:
        with AquaClient(sock_path, name="producer") as producer:
            producer.lease("producer", "cpu0", MIB, memory.handle())
            assert store.reserve("req-1", 4096) is None  # whole 64 MiB allocations only, there
        old.stop()
        server_module.OPS = ops
        new = CoordinatorServer(sock_path)
        new.start()
        with AquaClient(sock_path, name="producer") as producer:
            producer.lease("producer", "cpu0", MIB, memory.handle())
            wait_until(lambda: store.reserve("req-1", 4096) is not None, 10.0, "a piece borrowed")
            store.close()
    finally:
        server_module.OPS = ops
        store.close()
        if new is not None:
            new.stop()
        memory.close()


def test_an_empty_store_trades_its_small_piece_for_a_larger_one(
    server: CoordinatorServer, sock_path: str
) -> None:
    small, large = ShmRegion.create(MIB), ShmRegion.create(4 * MIB)
    producer = AquaClient(sock_path, name="producer")
    first = producer.lease("small", "cpu0", MIB, small.handle())
    store = LentRegionStore(sock_path, "engine", 4 * MIB, retry_seconds=0.0)
    try:
        assert store.reserve("req-1", 4096) is not None  # a 1 MiB piece: all there is
        second = producer.lease("large", "cpu0", 4 * MIB, large.handle())
        assert store.reserve("req-2", 2 * MIB) is None  # holding req-1: the piece is kept
        assert _regions(server) == [(first, "engine", MIB), (second, None, 0)]
        store.discard("req-1")
        assert store.reserve("req-2", 2 * MIB) is not None  # empty: traded up
        want = [(first, None, 0), (second, "engine", 4 * MIB)]  # the small piece freed by the watcher
        wait_until(lambda: _regions(server) == want, 10.0, "the small piece freed")
        assert (store.allocations, store.releases) == (2, 1)
    finally:
        store.close()
        producer.close()
        small.close()
        large.close()


def test_an_empty_store_keeps_its_piece_when_nothing_larger_is_free(
    server: CoordinatorServer, sock_path: str
) -> None:
    memory = ShmRegion.create(MIB)
    producer = AquaClient(sock_path, name="producer")
    region = producer.lease("small", "cpu0", MIB, memory.handle())
    store = LentRegionStore(sock_path, "engine", 4 * MIB, retry_seconds=0.0)
    try:
        for i in range(3):
            assert store.reserve(f"req-{i}", 4096) is not None
            store.discard(f"req-{i}")
        assert (store.allocations, store.releases) == (1, 0)  # no churn: the same piece
        assert _regions(server) == [(region, "engine", MIB)]
    finally:
        store.close()
        producer.close()
        memory.close()
