"""An engine whose `lent_bytes` (64 MiB by default) is more than any producer lends still borrows:
the coordinator gives the largest piece that holds what the engine needs now (`min_nbytes`)."""

from __future__ import annotations

import pytest

from serving.aqua.coordinator import AquaClient, Coordinator, CoordinatorServer, InvalidArgument
from serving.aqua.coordinator import server as server_module
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.offload.lent import LentRegionStore

MIB = 1 << 20
HANDLE = {"kind": "shm", "name": "x"}


def test_it_gives_the_largest_piece_when_no_region_holds_the_whole_request() -> None:
    c = Coordinator()
    small = c.lease("p1", "cpu0", 2 * MIB, HANDLE)
    big = c.lease("p2", "cpu0", 8 * MIB, HANDLE)
    assert c.allocate("eng", 64 * MIB) is None  # all or nothing, as before
    alloc = c.allocate("eng", 64 * MIB, min_nbytes=4096)
    assert alloc is not None and (alloc.region_id, alloc.offset, alloc.nbytes) == (big, 0, 8 * MIB)
    # The whole request still wins over a larger piece whenever a region can hold it.
    whole = c.allocate("eng2", 1 * MIB, min_nbytes=4096)
    assert whole is not None and (whole.region_id, whole.nbytes) == (small, 1 * MIB)
    assert c.allocate("eng3", 64 * MIB, min_nbytes=2 * MIB) is None  # no piece that large is free
    c.check_invariants()


def test_it_takes_the_largest_gap_between_allocations() -> None:
    c = Coordinator()
    region = c.lease("p", "cpu0", 8 * MIB, HANDLE)
    first = c.allocate("eng", 1 * MIB)
    second = c.allocate("eng", 3 * MIB)
    assert first is not None and second is not None
    c.allocate("eng", 4 * MIB)
    c.free(second.alloc_id)  # a 3 MiB hole between the first and the last allocation
    got = c.allocate("eng", 64 * MIB, min_nbytes=MIB)
    assert got is not None and (got.region_id, got.offset, got.nbytes) == (region, 1 * MIB, 3 * MIB)
    c.check_invariants()


def test_it_refuses_a_minimum_above_the_request() -> None:
    c = Coordinator()
    c.lease("p", "cpu0", 8 * MIB, HANDLE)
    with pytest.raises(InvalidArgument, match="min_nbytes"):
        c.allocate("eng", MIB, min_nbytes=2 * MIB)
    with pytest.raises(InvalidArgument, match="min_nbytes"):
        c.allocate("eng", MIB, min_nbytes=0)


def test_an_engine_asking_for_more_than_is_lent_borrows_what_there_is(
    server: CoordinatorServer, sock_path: str
) -> None:
    region = ShmRegion.create(MIB)
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cpu0", MIB, region.handle())
    store = LentRegionStore(sock_path, "engine", 64 * MIB)  # OffloadConfig's default lent_bytes
    try:
        assert store.reserve("req-1", 100_000) is not None
        assert store.reserve("req-2", 2 * MIB) is None  # more than the piece: the next tier
        regions = server.call(lambda c: c.stats())["regions"]
        assert [(r["consumer_id"], r["allocated_bytes"]) for r in regions] == [("engine", MIB)]
    finally:
        store.close()
        producer.close()
        region.close()


def test_it_still_borrows_whole_allocations_from_an_older_coordinator(
    server: CoordinatorServer, sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = dict(server_module.OPS, allocate=frozenset({"consumer_id", "nbytes", "device_hint"}))
    monkeypatch.setattr(server_module, "OPS", older)
    region = ShmRegion.create(4 * MIB)
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cpu0", 4 * MIB, region.handle())
    store = LentRegionStore(sock_path, "engine", 2 * MIB)
    try:
        assert store.reserve("req-1", 4096) is not None
        assert server.call(lambda c: c.stats())["regions"][0]["allocated_bytes"] == 2 * MIB
    finally:
        store.close()
        producer.close()
        region.close()
