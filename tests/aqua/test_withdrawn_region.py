"""A consumer's lent-region store when the producer's session ends (its process died): host memory
is evacuated, device memory (freed with the producer's process) is never read again."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from serving.aqua.coordinator import AquaClient, CoordinatorServer
from serving.aqua.memory.base import Region
from serving.aqua.memory.registry import register_region_kind
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.offload.lent import LentRegionStore
from tests.aqua.conftest import wait_until

NBYTES = 1 << 16


class FakeDeviceRegion(Region):
    """Device-like memory (not a HostRegion): a tensor in this process, named in the handle."""

    kind = "audit_fake_device"
    buffers: ClassVar[dict[str, torch.Tensor]] = {}

    def __init__(self, name: str, nbytes: int) -> None:
        super().__init__(nbytes, "cuda:1", owner=False)
        self.name = name

    @classmethod
    def attach(cls, handle: dict[str, Any]) -> FakeDeviceRegion:
        return cls(handle["name"], handle["nbytes"])

    def handle(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "nbytes": self.nbytes}

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        self._check(offset, nbytes)
        return self.buffers[self.name][offset : offset + nbytes]

    def close(self) -> None:
        self.closed = True


register_region_kind(FakeDeviceRegion.kind, FakeDeviceRegion.attach)


def _store_one(store: LentRegionStore) -> torch.Tensor:
    buf = store.reserve("req-1", 4096)
    assert buf is not None, "the store should allocate from the lent region"
    buf.copy_(torch.arange(4096, dtype=torch.int64).to(torch.uint8))
    return buf.clone()


def test_it_drops_kv_held_in_withdrawn_device_memory_unread(
    server: CoordinatorServer, sock_path: str
) -> None:
    FakeDeviceRegion.buffers["dev"] = torch.zeros(NBYTES, dtype=torch.uint8)
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cuda:1", NBYTES, FakeDeviceRegion("dev", NBYTES).handle())
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    try:
        _store_one(store)
        producer.close()  # the producer process died: its exported device memory is gone
        # The watcher sees the withdrawal, drops the key unread and frees the allocation, which
        # removes the withdrawn region from the coordinator.
        wait_until(lambda: server.call(lambda c: c.stats())["regions"] == [], 5.0, "the region removed")
        assert store.poll() == []  # nothing handed out for evacuation: it would copy freed memory
        assert store.get("req-1") is None  # the request recomputes
        assert store.keys() == []
    finally:
        store.close()


def test_it_still_evacuates_kv_held_in_withdrawn_shared_memory(
    server: CoordinatorServer, sock_path: str
) -> None:
    region = ShmRegion.create(NBYTES)
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cpu0", NBYTES, region.handle())
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    try:
        expected = _store_one(store)
        producer.close()
        region.close()  # unlinked: the consumer's mapping stays readable
        wait_until(lambda: store.poll() == ["req-1"], 5.0, "the keys to evacuate")
        got = store.get("req-1")
        assert got is not None and torch.equal(got, expected)
        store.discard("req-1")
        wait_until(lambda: server.call(lambda c: c.stats())["regions"] == [], 5.0, "the region removed")
    finally:
        store.close()


def test_it_drops_device_kv_whose_producer_exits_while_a_reclaim_waits(
    server: CoordinatorServer, sock_path: str
) -> None:
    FakeDeviceRegion.buffers["dev2"] = torch.zeros(NBYTES, dtype=torch.uint8)
    producer = AquaClient(sock_path, name="producer")
    region_id = producer.lease("producer", "cuda:1", NBYTES, FakeDeviceRegion("dev2", NBYTES).handle())
    store = LentRegionStore(sock_path, "consumer", NBYTES)
    try:
        _store_one(store)
        assert producer.request_reclaim(region_id) == "pending"
        wait_until(lambda: store._reclaiming, 5.0, "the reclaim noticed")
        # The engine takes no step to evacuate; the producer gives up waiting and exits.
        producer.close()
        wait_until(lambda: server.call(lambda c: c.stats())["regions"] == [], 5.0, "the region removed")
        assert store.poll() == [] and store.get("req-1") is None
    finally:
        store.close()
