"""The coordinator state machine: every rule and every refusal, without any I/O."""

from __future__ import annotations

import pytest

from serving.aqua.coordinator import (
    ALIGNMENT,
    Coordinator,
    InvalidArgument,
    NotOwner,
    RegionBusy,
    UnknownAllocation,
    UnknownRegion,
)

SHM = {"kind": "shm", "name": "seg"}


def lease(
    c: Coordinator, nbytes: int = 4096, producer: str = "p1", device: str = "cpu0", session: str = "P"
) -> str:
    return c.lease(producer, device, nbytes, SHM, session=session)


def test_it_allocates_all_or_nothing_inside_one_region() -> None:
    c = Coordinator()
    lease(c, 1024)
    lease(c, 1024)
    assert c.allocate("c1", 2048, session="C") is None  # 2 x 1024 free, but never split across regions
    a = c.allocate("c1", 1024, session="C")
    assert a is not None and (a.region_id, a.offset, a.nbytes) == ("r1", 0, 1024)
    assert a.handle == SHM and a.producer_id == "p1" and a.device == "cpu0"


def test_it_aligns_offsets_and_reuses_freed_gaps_first_fit() -> None:
    c = Coordinator()
    lease(c, 4 * ALIGNMENT)
    a = c.allocate("c1", 10, session="C")
    b = c.allocate("c1", 10, session="C")
    assert a is not None and b is not None
    assert (a.offset, b.offset) == (0, ALIGNMENT)
    c.free(a.alloc_id, session="C")
    d = c.allocate("c1", ALIGNMENT, session="C")
    assert d is not None and d.offset == 0
    assert c.allocate("c1", 2 * ALIGNMENT + 1, session="C") is None  # only 2 aligned blocks left
    c.check_invariants()


def test_it_gives_a_region_to_at_most_one_consumer_until_it_is_emptied() -> None:
    c = Coordinator()
    lease(c, 4096)
    a = c.allocate("c1", 100, session="C1")
    assert a is not None
    assert c.allocate("c2", 100, session="C2") is None  # room left, but c1 holds the region
    assert c.stats()["pairings"] == [
        {"producer_id": "p1", "consumer_id": "c1", "region_id": "r1", "device": "cpu0"}
    ]
    c.free(a.alloc_id, session="C1")
    b = c.allocate("c2", 100, session="C2")
    assert b is not None and b.region_id == "r1"


def test_it_never_gives_a_producer_its_own_region() -> None:
    # Engines lease and allocate under one id (AQUA_ENGINE_ID): an engine that lends and borrows
    # must borrow another producer's memory, never its own (self-lending).
    c = Coordinator()
    own = lease(c, 4096, producer="eng-a", session="A")
    assert c.allocate("eng-a", 100, session="A/kv") is None  # same engine id, another session
    assert c.allocate("eng-a", 100, session="A") is None
    assert c.allocate("eng-a", 100, min_nbytes=1, session="A/kv") is None
    other = lease(c, 4096, producer="eng-b", session="B")
    a = c.allocate("eng-a", 100, session="A/kv")
    assert a is not None and a.region_id == other and a.producer_id == "eng-b"
    b = c.allocate("eng-b", 100, session="B/kv")  # eng-b borrows from eng-a, not from itself
    assert b is not None and b.region_id == own
    assert c.stats()["pairings"] == [
        {"producer_id": "eng-a", "consumer_id": "eng-b", "region_id": own, "device": "cpu0"},
        {"producer_id": "eng-b", "consumer_id": "eng-a", "region_id": other, "device": "cpu0"},
    ]
    c.check_invariants()


def test_it_prefers_the_hinted_device_then_regions_already_held() -> None:
    c = Coordinator()
    lease(c, 4096, device="cuda:0")
    lease(c, 4096, device="cuda:1")
    lease(c, 4096, device="cuda:1")
    a = c.allocate("c1", 100, device_hint="cuda:1", session="C")
    assert a is not None and a.region_id == "r2"
    b = c.allocate("c1", 100, session="C")
    assert b is not None and b.region_id == "r2"  # already held beats lease order
    c.allocate("c2", 100, device_hint="cuda:1", session="C2")
    d = c.allocate("c3", 100, device_hint="cuda:1", session="C3")
    assert d is not None and d.device == "cuda:0"  # hint is a preference, not a filter


def test_it_never_allocates_from_a_region_under_reclaim() -> None:
    c = Coordinator()
    r = lease(c, 4096)
    a = c.allocate("c1", 100, session="C")
    assert a is not None
    assert c.request_reclaim(r, session="P") == "pending"
    assert c.allocate("c1", 100, session="C") is None
    assert [p.alloc_id for p in c.pending_reclaims("c1")] == [a.alloc_id]
    assert c.pending_reclaims("c2") == []


def test_it_reports_reclaim_done_exactly_when_the_last_allocation_goes() -> None:
    c = Coordinator()
    r = lease(c, 4096)
    assert c.reclaim_status(r) == "none"
    a = c.allocate("c1", 100, session="C")
    b = c.allocate("c1", 100, session="C")
    assert a is not None and b is not None
    c.request_reclaim(r, session="P")
    c.free(a.alloc_id, session="C")
    assert c.reclaim_status(r) == "pending"
    c.free(b.alloc_id, session="C")
    assert c.reclaim_status(r) == "done"
    assert c.pending_reclaims("c1") == []
    c.unlease(r, session="P")
    with pytest.raises(UnknownRegion):
        c.reclaim_status(r)


def test_it_reports_done_at_once_when_reclaiming_an_empty_region() -> None:
    c = Coordinator()
    r = lease(c)
    assert c.request_reclaim(r, session="P") == "done"
    assert c.request_reclaim(r, session="P") == "done"  # idempotent


def test_it_refuses_unlease_while_allocations_remain() -> None:
    c = Coordinator()
    r = lease(c)
    a = c.allocate("c1", 100, session="C")
    with pytest.raises(RegionBusy):
        c.unlease(r, session="P")
    assert a is not None
    c.free(a.alloc_id, session="C")
    c.unlease(r, session="P")
    assert c.stats()["regions"] == []


def test_it_resizes_but_never_below_the_highest_allocated_byte() -> None:
    c = Coordinator()
    r = lease(c, 4 * ALIGNMENT)
    c.allocate("c1", 10, session="C")
    b = c.allocate("c1", 10, session="C")  # at ALIGNMENT .. ALIGNMENT + 10
    assert b is not None
    with pytest.raises(RegionBusy):
        c.resize(r, ALIGNMENT + 9, session="P")
    c.resize(r, ALIGNMENT + 10, session="P")
    assert c.allocate("c1", 1, session="C") is None
    c.resize(r, 8 * ALIGNMENT, session="P")
    grown = c.allocate("c1", 4 * ALIGNMENT, session="C")
    assert grown is not None and grown.offset == 2 * ALIGNMENT


def test_it_never_leases_more_than_the_memory_behind_the_handle() -> None:
    c = Coordinator()
    handle = {"kind": "shm", "name": "seg", "nbytes": 4096}
    with pytest.raises(InvalidArgument, match="exceeds"):
        c.lease("p1", "cpu0", 4097, handle)
    r = c.lease("p1", "cpu0", 1024, handle)
    c.resize(r, 4096)
    with pytest.raises(InvalidArgument, match="exceeds"):
        c.resize(r, 4097)


@pytest.mark.parametrize("op", ["resize", "unlease", "request_reclaim"])
def test_it_refuses_producer_operations_from_another_session(op: str) -> None:
    c = Coordinator()
    r = lease(c, session="P")
    call = {
        "resize": lambda s: c.resize(r, 8192, session=s),
        "unlease": lambda s: c.unlease(r, session=s),
        "request_reclaim": lambda s: c.request_reclaim(r, session=s),
    }[op]
    with pytest.raises(NotOwner):
        call("intruder")
    assert c.reclaim_status(r) == "none" and c.stats()["regions"][0]["nbytes"] == 4096
    call("P")


@pytest.mark.parametrize("op", ["resize", "unlease", "request_reclaim", "reclaim_status"])
def test_it_refuses_unknown_regions(op: str) -> None:
    c = Coordinator()
    call = {
        "resize": lambda: c.resize("r9", 10, session="P"),
        "unlease": lambda: c.unlease("r9", session="P"),
        "request_reclaim": lambda: c.request_reclaim("r9", session="P"),
        "reclaim_status": lambda: c.reclaim_status("r9"),
    }[op]
    with pytest.raises(UnknownRegion):
        call()


def test_it_refuses_double_free_and_a_free_in_another_consumers_name() -> None:
    c = Coordinator()
    lease(c)
    a = c.allocate("c1", 100, session="C")
    assert a is not None
    with pytest.raises(NotOwner):
        c.free(a.alloc_id, consumer_id="c2", session="C")
    c.free(a.alloc_id, consumer_id="c1", session="other-process-of-c1")  # any session of c1 may free
    with pytest.raises(UnknownAllocation):
        c.free(a.alloc_id, session="C")
    with pytest.raises(UnknownAllocation):
        c.allocation(a.alloc_id)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.lease("p", "cpu0", 0, SHM), "nbytes"),
        (lambda c: c.lease("p", "cpu0", -5, SHM), "nbytes"),
        (lambda c: c.lease("p", "cpu0", True, SHM), "nbytes"),
        (lambda c: c.lease("", "cpu0", 10, SHM), "producer_id"),
        (lambda c: c.lease("p", "", 10, SHM), "device"),
        (lambda c: c.lease("p", "cpu0", 10, {"name": "x"}), "handle"),
        (lambda c: c.lease("p", "cpu0", 10, {"kind": "shm", "x": object()}), "handle"),
        (lambda c: c.allocate("c", 0), "nbytes"),
        (lambda c: c.allocate("", 10), "consumer_id"),
        (lambda c: c.allocate("c", 10, device_hint=""), "device_hint"),
        (lambda c: c.resize(c.lease("p", "cpu0", 10, SHM), 0), "nbytes"),
    ],
)
def test_it_rejects_bad_arguments_naming_the_field(call, field: str) -> None:
    c = Coordinator()
    with pytest.raises(InvalidArgument, match=field):
        call(c)


def test_it_frees_a_disconnected_consumers_allocations() -> None:
    c = Coordinator()
    r = lease(c)
    c.allocate("c1", 100, session="C1")
    kept = c.allocate("c1", 100, session="C1-worker")
    c.disconnect("C1")
    assert kept is not None
    assert [a["allocations"] for a in c.stats()["regions"]] == [1]
    assert c.allocation(kept.alloc_id) == kept
    c.disconnect("C1-worker")
    assert c.stats()["pairings"] == [] and c.reclaim_status(r) == "none"
    c.check_invariants()


def test_it_withdraws_a_disconnected_producers_regions() -> None:
    c = Coordinator()
    busy = lease(c, session="P")
    empty = lease(c, session="P")
    a = c.allocate("c1", 100, session="C")
    assert a is not None and a.region_id == busy
    c.disconnect("P")
    with pytest.raises(UnknownRegion):
        c.reclaim_status(empty)  # empty regions go at once
    assert c.reclaim_status(busy) == "pending"
    assert c.allocate("c1", 100, session="C") is None
    (pending,) = c.pending_reclaims("c1")
    assert pending.alloc_id == a.alloc_id and pending.withdrawn
    c.free(a.alloc_id, session="C")
    assert c.stats()["regions"] == []  # removed with its last allocation
    c.check_invariants()


def test_it_reports_per_device_stats() -> None:
    c = Coordinator()
    lease(c, 4096, device="cuda:0")
    lease(c, 1000, device="cuda:1", producer="p2")
    c.allocate("c1", 300, device_hint="cuda:1", session="C")
    s = c.stats()
    assert s["devices"] == {
        "cuda:0": {"leased_bytes": 4096, "allocated_bytes": 0, "regions": 1, "allocations": 0},
        "cuda:1": {"leased_bytes": 1000, "allocated_bytes": 300, "regions": 1, "allocations": 1},
    }
    assert s["pairings"] == [
        {"producer_id": "p2", "consumer_id": "c1", "region_id": "r2", "device": "cuda:1"}
    ]
