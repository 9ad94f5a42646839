"""Property tests: random lease / resize / allocate / free / reclaim / unlease / disconnect
sequences by several producers and consumers, checked against an independent model.

Properties: a region never serves two consumers at once; allocations never overlap nor pass the
region's end; nothing is allocated from a region under reclaim, nor from one the consumer excluded;
allocate returns None only when no eligible region has room; with `min_nbytes`, when none has room
for the whole request, exactly the largest eligible piece of at least that size is given; reclaim
is "done" exactly when the last allocation is gone; every refusal happens exactly when the rules
say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from serving.aqua.coordinator import (
    ALIGNMENT,
    Allocation,
    Coordinator,
    InvalidArgument,
    NotOwner,
    RegionBusy,
    UnknownAllocation,
    UnknownRegion,
)

PRODUCERS = ["P1", "P2", "P3"]  # producer id == its session
CONSUMERS = ["c1", "c2", "c3"]
DEVICES = ["d0", "d1"]
SIZES = st.integers(1, 16 * ALIGNMENT)
# Whole blocks often, so freed gaps and region ends get filled exactly (the edges of first fit)
ALLOC_SIZES = st.one_of(st.integers(1, 2 * ALIGNMENT), st.sampled_from([ALIGNMENT, 2 * ALIGNMENT]))


@dataclass
class ModelRegion:
    session: str
    device: str
    nbytes: int
    reclaiming: bool = False
    withdrawn: bool = False
    allocs: dict[str, Allocation] = field(default_factory=dict)

    def consumer(self) -> str | None:
        return next((a.consumer_id for a in self.allocs.values()), None)

    def high_water(self) -> int:
        return max((a.offset + a.nbytes for a in self.allocs.values()), default=0)

    def first_fit(self, nbytes: int) -> int | None:
        """The lowest aligned offset with `nbytes` free after it, computed from the model."""
        spans = sorted((a.offset, a.offset + a.nbytes) for a in self.allocs.values())
        starts = [0] + [-(-end // ALIGNMENT) * ALIGNMENT for _, end in spans]
        limits = [s for s, _ in spans] + [self.nbytes]
        return next((s for s, lim in zip(starts, limits, strict=True) if lim - s >= nbytes), None)

    def has_room(self, nbytes: int) -> bool:
        return self.first_fit(nbytes) is not None

    def largest_gap(self) -> tuple[int, int]:
        """(offset, size) of the largest aligned free run, the lowest one on ties."""
        spans = sorted((a.offset, a.offset + a.nbytes) for a in self.allocs.values())
        starts = [0] + [-(-end // ALIGNMENT) * ALIGNMENT for _, end in spans]
        limits = [s for s, _ in spans] + [self.nbytes]
        gaps = [(s, lim - s) for s, lim in zip(starts, limits, strict=True)]
        return max(gaps, key=lambda g: (g[1], -g[0]))


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Coordinator()
        self.regions: dict[str, ModelRegion] = {}
        self.allocs: dict[str, tuple[Allocation, str]] = {}  # alloc_id -> (allocation, session)
        self.freed: list[str] = []

    # ----------------------------------------------------------------- helpers
    def _pick_region(self, data: st.DataObject) -> str | None:
        live = sorted(rid for rid, r in self.regions.items() if not r.withdrawn)
        return data.draw(st.sampled_from(live)) if live else None

    def _drop(self, alloc_id: str) -> None:
        alloc, _ = self.allocs.pop(alloc_id)
        region = self.regions[alloc.region_id]
        del region.allocs[alloc_id]
        if region.withdrawn and not region.allocs:
            del self.regions[alloc.region_id]
        self.freed.append(alloc_id)

    # ----------------------------------------------------------------- producer rules
    @initialize(sizes=st.lists(st.sampled_from([4, 8, 16]), min_size=len(PRODUCERS), max_size=len(PRODUCERS)))
    def lend_one_region_each(self, sizes: list[int]) -> None:
        for producer, blocks, device in zip(PRODUCERS, sizes, DEVICES * 2, strict=False):
            self.lease(producer, device, blocks * ALIGNMENT)

    @rule(
        producer=st.sampled_from(PRODUCERS),
        device=st.sampled_from(DEVICES),
        nbytes=st.one_of(SIZES, st.sampled_from([4 * ALIGNMENT, 8 * ALIGNMENT])),
    )
    def lease(self, producer: str, device: str, nbytes: int) -> None:
        rid = self.c.lease(
            producer, device, nbytes, {"kind": "shm", "name": rid_name(producer)}, session=producer
        )
        assert rid not in self.regions
        self.regions[rid] = ModelRegion(producer, device, nbytes)

    @rule(data=st.data(), intruder=st.booleans())
    def resize(self, data: st.DataObject, intruder: bool) -> None:
        rid = self._pick_region(data)
        if rid is None:
            return
        region = self.regions[rid]
        edge = [n for n in (region.high_water() - 1, region.high_water()) if n > 0]
        nbytes = data.draw(st.one_of(SIZES, st.sampled_from(edge)) if edge else SIZES)
        if intruder:
            with pytest.raises(NotOwner):
                self.c.resize(rid, nbytes, session="intruder")
        elif nbytes < region.high_water():
            with pytest.raises(RegionBusy):
                self.c.resize(rid, nbytes, session=region.session)
        else:
            self.c.resize(rid, nbytes, session=region.session)
            region.nbytes = nbytes

    @rule(data=st.data(), intruder=st.booleans())
    def request_reclaim(self, data: st.DataObject, intruder: bool) -> None:
        rid = self._pick_region(data)
        if rid is None:
            return
        region = self.regions[rid]
        if intruder:
            with pytest.raises(NotOwner):
                self.c.request_reclaim(rid, session="intruder")
            return
        status = self.c.request_reclaim(rid, session=region.session)
        region.reclaiming = True
        assert status == ("pending" if region.allocs else "done")

    @rule(data=st.data())
    def unlease(self, data: st.DataObject) -> None:
        rid = self._pick_region(data)
        if rid is None:
            return
        region = self.regions[rid]
        if region.allocs:
            with pytest.raises(RegionBusy):
                self.c.unlease(rid, session=region.session)
        else:
            self.c.unlease(rid, session=region.session)
            del self.regions[rid]
            with pytest.raises(UnknownRegion):
                self.c.reclaim_status(rid)

    # ----------------------------------------------------------------- consumer rules
    @rule(
        consumer=st.sampled_from(CONSUMERS),
        worker=st.sampled_from(["a", "b"]),
        sizes=st.lists(ALLOC_SIZES, min_size=1, max_size=3),
        hint=st.sampled_from([None, *DEVICES]),
    )
    def allocate(self, consumer: str, worker: str, sizes: list[int], hint: str | None) -> None:
        for nbytes in sizes:
            self._allocate(consumer, f"{consumer}/{worker}", nbytes, hint)  # two processes per consumer

    @rule(
        data=st.data(),
        consumer=st.sampled_from(CONSUMERS),
        sizes=st.lists(ALLOC_SIZES, min_size=1, max_size=2),
    )
    def churn(self, data: st.DataObject, consumer: str, sizes: list[int]) -> None:
        """Free one of the consumer's allocations, then allocate again: holes get refilled."""
        mine = sorted(aid for aid, (a, _) in self.allocs.items() if a.consumer_id == consumer)
        if mine:
            alloc_id = data.draw(st.sampled_from(mine))
            hole = -(-self.allocs[alloc_id][0].nbytes // ALIGNMENT) * ALIGNMENT
            self.c.free(alloc_id, consumer_id=consumer)
            self._drop(alloc_id)
            sizes = [hole, *sizes]  # exactly the aligned hole: first fit's edge case
        for nbytes in sizes:
            self._allocate(consumer, f"{consumer}/a", nbytes, None)

    @rule(
        data=st.data(),
        consumer=st.sampled_from(CONSUMERS),
        # often more than any region holds: the largest piece of at least `least` bytes
        requests=st.lists(
            st.tuples(st.integers(1, 20 * ALIGNMENT), st.integers(1, 6 * ALIGNMENT)), max_size=3
        ),
        hint=st.sampled_from([None, *DEVICES]),
    )
    def allocate_a_piece(
        self, data: st.DataObject, consumer: str, requests: list[tuple[int, int]], hint: str | None
    ) -> None:
        for nbytes, least in requests:
            exclude = data.draw(st.lists(st.sampled_from([*sorted(self.regions), "r999"]), max_size=2))
            if least > nbytes:
                with pytest.raises(InvalidArgument, match="min_nbytes"):
                    self.c.allocate(consumer, nbytes, hint, min_nbytes=least, session=f"{consumer}/a")
                continue
            self._allocate(consumer, f"{consumer}/a", nbytes, hint, least, exclude)

    def _allocate(
        self,
        consumer: str,
        session: str,
        nbytes: int,
        hint: str | None,
        least: int | None = None,
        exclude: list[str] | None = None,
    ) -> None:
        eligible = {
            rid: r
            for rid, r in self.regions.items()
            if not r.reclaiming and r.consumer() in (None, consumer) and rid not in (exclude or [])
        }
        alloc = self.c.allocate(
            consumer, nbytes, hint, min_nbytes=least, exclude_regions=exclude, session=session
        )
        whole = any(r.has_room(nbytes) for r in eligible.values())
        order = sorted(
            eligible,
            key=lambda rid: (
                hint is not None and eligible[rid].device != hint,
                eligible[rid].consumer() != consumer,
                int(rid[1:]),
            ),
        )
        pieces = [(rid, *eligible[rid].largest_gap()) for rid in order]
        pieces = [p for p in pieces if least is not None and p[2] >= least]
        if alloc is None:
            assert not whole, "refused although a region fits"
            assert not pieces, "refused although a large enough piece is free"
            return
        assert alloc.region_id in eligible, (
            "allocated from a region under reclaim, held by another consumer or excluded"
        )
        region = eligible[alloc.region_id]
        if not whole:  # the largest piece, the first one in candidate order on ties
            rid, offset, size = max(pieces, key=lambda p: p[2])
            assert (alloc.region_id, alloc.offset, alloc.nbytes) == (rid, offset, min(nbytes, size))
            assert least is not None and least <= alloc.nbytes < nbytes
            nbytes = alloc.nbytes
        assert (alloc.consumer_id, alloc.nbytes, alloc.device) == (consumer, nbytes, region.device)
        assert alloc.offset == region.first_fit(nbytes), "not the lowest aligned gap that fits"
        assert alloc.offset + nbytes <= region.nbytes
        for other in region.allocs.values():
            assert alloc.offset + nbytes <= other.offset or other.offset + other.nbytes <= alloc.offset
        if hint is not None and region.device != hint:
            assert not any(r.has_room(nbytes) for r in eligible.values() if r.device == hint)
        region.allocs[alloc.alloc_id] = alloc
        self.allocs[alloc.alloc_id] = (alloc, session)

    @rule(data=st.data(), count=st.integers(1, 3))
    def free(self, data: st.DataObject, count: int) -> None:
        for _ in range(min(count, len(self.allocs))):
            alloc_id = data.draw(st.sampled_from(sorted(self.allocs)))
            self.c.free(alloc_id, session="any-process")
            self._drop(alloc_id)

    @rule(data=st.data())
    def free_in_another_consumers_name(self, data: st.DataObject) -> None:
        if not self.allocs:
            return
        alloc, _ = self.allocs[data.draw(st.sampled_from(sorted(self.allocs)))]
        other = next(c for c in CONSUMERS if c != alloc.consumer_id)
        with pytest.raises(NotOwner):
            self.c.free(alloc.alloc_id, consumer_id=other, session=other)

    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        if self.freed:
            with pytest.raises(UnknownAllocation):
                self.c.free(data.draw(st.sampled_from(self.freed)))

    @rule(session=st.sampled_from([*PRODUCERS, *(f"{c}/{w}" for c in CONSUMERS for w in "ab")]))
    def disconnect(self, session: str) -> None:
        self.c.disconnect(session)
        for alloc_id, (_, owner) in list(self.allocs.items()):
            if owner == session:
                self._drop(alloc_id)
        for rid, region in list(self.regions.items()):
            if region.session == session and not region.withdrawn:
                region.reclaiming = region.withdrawn = True
                if not region.allocs:
                    del self.regions[rid]

    # ----------------------------------------------------------------- invariants
    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        self.c.check_invariants()

    @invariant()
    def regions_and_reclaims_match_the_model(self) -> None:
        stats = {r["region_id"]: r for r in self.c.stats()["regions"]}
        assert set(stats) == set(self.regions)
        for rid, region in self.regions.items():
            expected = "none" if not region.reclaiming else ("pending" if region.allocs else "done")
            assert self.c.reclaim_status(rid) == expected
            assert stats[rid]["consumer_id"] == region.consumer()
            assert stats[rid]["allocated_bytes"] == sum(a.nbytes for a in region.allocs.values())

    @invariant()
    def consumers_see_exactly_what_they_must_give_back(self) -> None:
        for consumer in CONSUMERS:
            got = {a.alloc_id: a.withdrawn for a in self.c.pending_reclaims(consumer)}
            want = {
                aid: r.withdrawn
                for r in self.regions.values()
                if r.reclaiming
                for aid, a in r.allocs.items()
                if a.consumer_id == consumer
            }
            assert got == want


def rid_name(producer: str) -> str:
    return f"seg-{producer}"


CoordinatorMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
test_coordinator_state_machine = CoordinatorMachine.TestCase
