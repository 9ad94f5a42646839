"""Memory regions: shared-memory ownership, bounds, aliasing views, DRAM fallback, the registry."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import torch

from serving.aqua.memory import Region, RegionUnavailable, ShmRegion, open_region, register_region_kind
from serving.aqua.memory.dram import DramBuffer
from tests.aqua.conftest import REPO

# A consumer in ANOTHER interpreter (its own resource tracker): attach, write, exit normally.
# It prints its resource tracker's pid: that process unlinks "leaked" segments after the exit.
CONSUMER = """
import json, sys
from multiprocessing import resource_tracker
from serving.aqua.memory import open_region
region = open_region(json.loads(sys.argv[1]))
region.write(100, b"from the consumer")
region.close()
print(resource_tracker._resource_tracker._pid)
"""


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"resource tracker {pid} still running")


def test_it_lets_a_consumer_see_and_change_the_producers_bytes() -> None:
    with ShmRegion.create(4096) as owner:
        consumer = open_region(json.loads(json.dumps(owner.handle())))
        owner.write(0, b"producer")
        assert bytes(consumer.view(0, 8)) == b"producer"
        consumer.view(8, 3)[:] = b"abc"
        assert bytes(owner.view(0, 11)) == b"producerabc"
        consumer.close()


def test_it_survives_a_consumer_process_exiting() -> None:
    owner = ShmRegion.create(4096)
    try:
        out = subprocess.run(
            [sys.executable, "-c", CONSUMER, json.dumps(owner.handle())],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
        wait_gone(int(out.stdout))
        assert "leaked" not in out.stderr
        again = ShmRegion.attach(owner.handle())  # the segment still exists after that exit
        assert bytes(again.view(100, 17)) == b"from the consumer"
        again.close()
    finally:
        owner.close()


def test_it_unlinks_the_segment_when_its_owner_closes() -> None:
    owner = ShmRegion.create(4096)
    handle = owner.handle()
    consumer = open_region(handle)
    owner.write(0, b"kept")
    owner.close()
    with pytest.raises(RegionUnavailable):
        open_region(handle)
    assert bytes(consumer.view(0, 4)) == b"kept"  # an existing mapping stays valid
    consumer.close()


def test_it_keeps_views_valid_when_closed_under_them() -> None:
    owner = ShmRegion.create(4096)
    view = owner.view(0, 4)
    view[:] = b"live"
    owner.close()
    assert bytes(view) == b"live"
    with pytest.raises(ValueError, match="closed"):
        owner.view(0, 4)


@pytest.mark.parametrize("make", [lambda: ShmRegion.create(1000), lambda: DramBuffer(1000, pin=False)])
def test_it_refuses_access_outside_the_region(make) -> None:
    region: Region = make()
    with pytest.raises(IndexError):
        region.view(990, 11)
    with pytest.raises(IndexError):
        region.write(-1, b"x")
    with pytest.raises(IndexError):
        region.read_into(999, bytearray(2))
    with pytest.raises(IndexError):
        region.tensor(0, 1001)
    region.write(990, b"0123456789")  # the last byte is fine
    assert bytes(region.view(990, 10)) == b"0123456789"
    region.close()


@pytest.mark.parametrize("make", [lambda: ShmRegion.create(1 << 16), lambda: DramBuffer(1 << 16, pin=False)])
def test_it_copies_tensors_of_any_dtype_and_aliases_tensor_views(make) -> None:
    region: Region = make()
    src = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    region.write(256, src)
    out = torch.empty_like(src)
    region.read_into(256, out)
    assert torch.equal(out, src)
    alias = region.tensor(256, src.numel() * 4)
    alias.zero_()  # writes through to the region
    region.read_into(256, out)
    assert not out.any()
    region.close()


def test_it_keeps_dram_buffers_private_to_their_process() -> None:
    buf = DramBuffer(1024, pin=False)
    assert not buf.pinned
    with pytest.raises(RegionUnavailable, match="dram"):
        open_region(buf.handle())
    buf.close()


def test_it_rejects_unknown_and_duplicate_region_kinds() -> None:
    with pytest.raises(RegionUnavailable, match="nvme"):
        open_region({"kind": "nvme"})
    with pytest.raises(ValueError, match="already registered"):
        register_region_kind("shm", ShmRegion.attach)


def test_it_rejects_a_lease_size_beyond_the_segment() -> None:
    owner = ShmRegion.create(4096)
    with pytest.raises(ValueError, match="exceeds"):
        ShmRegion.attach({**owner.handle(), "nbytes": 1 << 20})
    owner.close()
