"""A consumer that hammers the coordinator and checks its data: used by test_concurrency.

Every allocation gets a pattern unique to (consumer, allocation) written into the producer's
shared memory; it is checked whenever the consumer verifies, evacuates (reclaim) or frees. A
region given to two consumers shows up in the intervals each consumer surely held its
allocations (`held`), overlapping allocations as corrupt patterns.

Run in-process (`hammer(...)`, from threads) or as a process:
    python -m tests.aqua.hammer --socket S --consumer ID --seed N --iterations K
which prints the result dict as one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from typing import Any

from serving.aqua.coordinator import Allocation, AquaClient, UnknownAllocation
from serving.aqua.memory import Region, RegionUnavailable, open_region


def pattern(consumer_id: str, alloc: Allocation) -> bytes:
    seed = hashlib.sha256(f"{consumer_id}/{alloc.alloc_id}/{alloc.region_id}".encode()).digest()
    return (seed * (alloc.nbytes // len(seed) + 1))[: alloc.nbytes]


class Hammer:
    def __init__(self, client: AquaClient, consumer_id: str, seed: int) -> None:
        self.client = client
        self.consumer_id = consumer_id
        self.rng = random.Random(seed)
        self.regions: dict[str, Region] = {}  # region_id -> attached memory
        self.held: dict[str, Allocation] = {}
        self.since: dict[str, float] = {}  # alloc_id -> when allocate returned
        self.result: dict[str, Any] = {
            "allocated": 0,
            "refused": 0,
            "freed": 0,
            "evacuated": 0,
            "corrupt": [],
            # [region_id, consumer_id, t0, t1]: the allocation was surely live from t0 (allocate
            # returned) to t1 (free sent); CLOCK_MONOTONIC is comparable across processes
            "held": [],
        }

    def region(self, alloc: Allocation) -> Region:
        if alloc.region_id not in self.regions:
            self.regions[alloc.region_id] = open_region(alloc.handle)
        return self.regions[alloc.region_id]

    def check(self, alloc: Allocation) -> bytes:
        data = bytes(self.region(alloc).view(alloc.offset, alloc.nbytes))
        if data != pattern(self.consumer_id, alloc):
            self.result["corrupt"].append(alloc.alloc_id)
        return data

    def release(self, alloc: Allocation) -> None:
        self.check(alloc)
        self.result["held"].append(
            [alloc.region_id, self.consumer_id, self.since.pop(alloc.alloc_id), time.monotonic()]
        )
        self.client.free(alloc.alloc_id, consumer_id=self.consumer_id)
        del self.held[alloc.alloc_id]
        self.result["freed"] += 1

    def evacuate_pending(self) -> None:
        """Evacuate what a reclaim asks for: read it into our memory (checking its pattern), then free it."""
        for alloc in self.client.pending_reclaims(self.consumer_id):
            if alloc.alloc_id in self.held:
                self.release(alloc)
                self.result["evacuated"] += 1

    def allocate(self, nbytes: int, min_nbytes: int | None = None) -> Allocation | None:
        """Allocate and write this allocation's pattern; None if refused (or found unavailable)."""
        got = self.client.allocate(self.consumer_id, nbytes, min_nbytes=min_nbytes)
        now = time.monotonic()
        if got is None:
            self.result["refused"] += 1
            return None
        if not (min_nbytes or nbytes) <= got.nbytes <= nbytes:
            self.result["corrupt"].append(f"size {got.alloc_id}: {got.nbytes} for {min_nbytes}..{nbytes}")
        try:
            self.region(got).view(got.offset, got.nbytes)[:] = pattern(self.consumer_id, got)
        except RegionUnavailable:  # a producer released memory it had lent to us: a bug
            self.result["corrupt"].append(f"unavailable {got.alloc_id}")
            self.client.free(got.alloc_id)
            return None
        self.held[got.alloc_id] = got
        self.since[got.alloc_id] = now
        self.result["allocated"] += 1
        return got

    def hold_until_reclaimed(self, timeout_s: float, poll_s: float = 0.005) -> None:
        """Keep every allocation until a reclaim asks for it (or `timeout_s` passes)."""
        deadline = time.monotonic() + timeout_s
        while self.held and time.monotonic() < deadline:
            self.evacuate_pending()
            time.sleep(poll_s)

    def step(self) -> None:
        self.evacuate_pending()
        roll = self.rng.random()
        if roll < 0.15:  # more than a lender's region: the largest piece of at least min_nbytes
            self.allocate(self.rng.randint(6000, 64 * 1024), min_nbytes=self.rng.randint(1, 6000))
        elif roll < 0.55 or not self.held:
            self.allocate(self.rng.randint(1, 6000))
        elif roll < 0.9:
            self.release(self.held[self.rng.choice(sorted(self.held))])
        else:
            for alloc in list(self.held.values()):
                self.check(alloc)

    def finish(self) -> dict[str, Any]:
        for alloc in list(self.held.values()):
            try:
                self.release(alloc)
            except UnknownAllocation:  # freed for us only if our session died, which it did not
                self.result["corrupt"].append(f"lost {alloc.alloc_id}")
        for region in self.regions.values():
            region.close()
        return self.result


def hammer(
    socket_path: str, consumer_id: str, seed: int, iterations: int, client: AquaClient | None = None
) -> dict[str, Any]:
    own = client is None
    c = client if client is not None else AquaClient(socket_path, name=consumer_id)
    h = Hammer(c, consumer_id, seed)
    for _ in range(iterations):
        h.step()
    result = h.finish()
    if own:
        c.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--iterations", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(hammer(args.socket, args.consumer, args.seed, args.iterations)), flush=True)


if __name__ == "__main__":
    main()
