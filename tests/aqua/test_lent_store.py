"""The KV connector's lent-region store against a real coordinator and a real shm region."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from serving.aqua.coordinator import AquaClient, CoordinatorServer
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.offload.lent import LentRegionStore
from tests.aqua.conftest import wait_until

NBYTES = 1 << 16


@pytest.fixture
def lender(server: CoordinatorServer, sock_path: str) -> Iterator[tuple[AquaClient, str]]:
    """A producer that leases one shm region; yields its client and the region id."""
    region = ShmRegion.create(NBYTES)
    client = AquaClient(sock_path, name="producer")
    region_id = client.lease("producer", "cpu0", NBYTES, region.handle())
    yield client, region_id
    client.close()
    region.close()


def _store_one(store: LentRegionStore) -> torch.Tensor:
    buf = store.reserve("req-1", 4096)
    assert buf is not None, "the store should allocate from the lent region"
    buf.copy_(torch.arange(4096, dtype=torch.int64).to(torch.uint8))
    return buf.clone()


def test_it_hands_back_stored_keys_for_evacuation_on_reclaim_then_frees(
    lender: tuple[AquaClient, str], sock_path: str
) -> None:
    producer, region_id = lender
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    try:
        expected = _store_one(store)
        assert producer.request_reclaim(region_id) == "pending"
        # The watcher notices the reclaim within its interval; then the step's poll lists the keys.
        wait_until(lambda: store.poll() == ["req-1"], 5.0, "the keys to evacuate")
        got = store.get("req-1")
        assert got is not None and torch.equal(got, expected)  # still readable until discarded
        store.discard("req-1")
        assert store.get("req-1") is None  # detached at once: nothing is read from a freed region
        wait_until(lambda: producer.reclaim_status(region_id) == "done", 5.0, "the watcher's free")
    finally:
        store.close()


def test_it_drops_its_data_instead_of_evacuating_when_the_coordinator_is_gone(
    lender: tuple[AquaClient, str], server: CoordinatorServer, sock_path: str
) -> None:
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    try:
        _store_one(store)
        store._stop.set()  # the watcher stays out: the step's poll alone must notice the lost session
        store._watcher.join()
        server.stop()  # the session ends: the coordinator no longer vouches for the allocation
        assert store.poll() == []  # nothing to evacuate: reading those bytes could restore wrong KV
        assert store.get("req-1") is None  # the request recomputes
        assert store.keys() == []
    finally:
        store.close()


def test_the_step_poll_makes_no_coordinator_call(
    lender: tuple[AquaClient, str], sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, region_id = lender
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    try:
        _store_one(store)
        calls: list[str] = []
        real = store.client._call

        def counted(op: str, **args: object) -> object:
            calls.append(op)
            return real(op, **args)

        monkeypatch.setattr(store.client, "_call", counted)
        store._stop.set()  # the watcher's calls are not the step's
        store._watcher.join()
        for _ in range(100):
            assert store.poll() == []
        assert calls == []
        # ...while the watcher is what notices a reclaim
        assert producer.request_reclaim(region_id) == "pending"
        assert store.poll() == []
        store._check_reclaim()
        assert store.poll() == ["req-1"] and calls == ["pending_reclaims"]
    finally:
        store.close()


@pytest.mark.usefixtures("server")
def test_an_allocation_beyond_the_attached_memory_is_given_back_not_raised(sock_path: str) -> None:
    # A handle without "nbytes" lets a lease exceed its segment (the coordinator cannot know).
    small = ShmRegion.create(4096)
    handle = {k: v for k, v in small.handle().items() if k != "nbytes"}
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cpu0", NBYTES, handle)
    store = LentRegionStore(sock_path, "c1", NBYTES)
    try:
        assert store.reserve("req-1", 100) is None  # the next tier holds it
        wait_until(lambda: producer.stats()["regions"][0]["allocations"] == 0, what="the free")
    finally:
        store.close()
        producer.close()
        small.close()
