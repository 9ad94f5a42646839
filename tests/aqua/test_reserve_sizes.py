"""Every KV store refuses a `reserve` of zero or negative bytes with a ValueError naming the size,
and keeps what it held: a negative size used to hand out a view of almost the whole lent region,
a zero size an empty entry that a load would restore as if saved."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from serving.aqua.coordinator import AquaClient, CoordinatorServer
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.offload.dram import DramStore
from serving.aqua.offload.lent import LentRegionStore
from serving.aqua.offload.store import KVStore

NBYTES = 1 << 16


@pytest.fixture
def lent_store(server: CoordinatorServer, sock_path: str) -> Iterator[LentRegionStore]:
    region = ShmRegion.create(NBYTES)
    producer = AquaClient(sock_path, name="producer")
    producer.lease("producer", "cpu0", NBYTES, region.handle())
    store = LentRegionStore(sock_path, "engine", NBYTES, retry_seconds=0.0)
    yield store
    store.close()
    producer.close()
    region.close()


@pytest.fixture(params=["dram", "lent"])
def store(request: pytest.FixtureRequest) -> KVStore:
    make: dict[str, Callable[[], KVStore]] = {
        "dram": lambda: DramStore(NBYTES, pin=False),
        "lent": lambda: request.getfixturevalue("lent_store"),
    }
    return make[request.param]()


@pytest.mark.parametrize("nbytes", [0, -1, -4096])
def test_it_refuses_a_size_that_is_not_positive_and_keeps_what_it_held(store: KVStore, nbytes: int) -> None:
    held = store.reserve("req-1", 4096)
    assert held is not None
    held.fill_(7)
    with pytest.raises(ValueError, match=rf"nbytes={nbytes}\b"):
        store.reserve("req-1", nbytes)
    with pytest.raises(ValueError, match=rf"nbytes={nbytes}\b"):
        store.reserve("req-2", nbytes)
    assert store.keys() == ["req-1"]
    got = store.get("req-1")
    assert got is not None and got.numel() == 4096 and bool(torch.all(got == 7))
    store.close()
