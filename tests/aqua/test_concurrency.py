"""Many producers and consumers, threads and processes, on one standalone coordinator.

Producers are real lender processes owning shared-memory segments; one reclaims mid-run and one
consumer process is SIGKILLed mid-run. Every consumer writes a pattern unique to each of its
allocations into the lent memory and checks it on every verify, evacuation and free: overlapping
allocations would corrupt someone's pattern. Each consumer also reports when it surely held each
allocation; two consumers' spans on one region must never overlap.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from serving.aqua.coordinator import AquaClient
from tests.aqua.conftest import REPO
from tests.aqua.hammer import Hammer, hammer

ITERATIONS = 300


def lender(sock: str, name: str, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A producer process that has leased its region, and its "leased" event."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.aqua.producer",
            "--socket",
            sock,
            "--nbytes",
            str(48 * 1024),
            "--producer-id",
            name,
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    leased = json.loads(proc.stdout.readline())
    assert leased["event"] == "leased"
    return proc, leased


def consumer_process(sock: str, name: str, seed: int, iterations: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.aqua.hammer",
            "--socket",
            sock,
            "--consumer",
            name,
            "--seed",
            str(seed),
            "--iterations",
            str(iterations),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_it_never_shares_a_region_nor_loses_data_under_concurrent_clients(server_process: str) -> None:
    sock = server_process
    reclaimer, reclaimed = lender(sock, "prod-reclaim")
    # The holder takes an allocation in the region to be reclaimed before anyone else runs (the
    # only region, so surely there) and keeps it until the reclaim asks for it: the reclaim always
    # meets a live allocation, however fast the others finish.
    holder = Hammer(AquaClient(sock, name="c-holder"), "c-holder", seed=30)
    kept = holder.allocate(4096)
    assert kept is not None and kept.region_id == reclaimed["region_id"]
    steady = [lender(sock, f"prod-{i}")[0] for i in range(3)]
    victim = consumer_process(sock, "c-victim", 99, 10**9)  # runs until killed
    procs = [consumer_process(sock, f"c-proc-{i}", i, ITERATIONS) for i in range(3)]

    results: dict[str, dict[str, Any]] = {}
    shared = AquaClient(sock, name="two threads, one client")

    def run(name: str, seed: int, client: AquaClient | None) -> None:
        results[f"{name}#{seed}"] = hammer(sock, name, seed, ITERATIONS, client)

    threads = [threading.Thread(target=run, args=(f"c-thread-{i}", 10 + i, None)) for i in range(3)]
    threads += [threading.Thread(target=run, args=("c-shared", 20 + i, shared)) for i in range(2)]

    def hold() -> None:
        holder.hold_until_reclaimed(timeout_s=60)
        results["c-holder"] = holder.finish()
        holder.client.close()

    threads.append(threading.Thread(target=hold))
    for t in threads:
        t.start()
    time.sleep(0.3)
    reclaimer.send_signal(signal.SIGUSR1)
    victim.send_signal(signal.SIGKILL)

    for t in threads:
        t.join(120)
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        results[f"c-proc-{i}"] = json.loads(out)
    victim.wait(10)
    shared.close()

    assert reclaimer.stdout is not None
    events = [json.loads(line) for line in reclaimer.stdout]
    assert reclaimer.wait(30) == 0 and events[-1]["event"] == "reclaimed" and events[-1]["clean"]

    assert len(results) == 9
    for name, r in results.items():
        assert r["corrupt"] == [], f"{name}: corrupted or lost allocations {r['corrupt']}"
    assert sum(r["allocated"] for r in results.values()) > 100
    assert sum(r["refused"] for r in results.values()) > 0  # regions were contended
    assert results["c-holder"]["evacuated"] == 1  # the reclaim met the holder's allocation
    assert sum(r["allocated"] for r in results.values()) == sum(r["freed"] for r in results.values())

    spans: dict[str, list[tuple[float, float, str]]] = {}
    for r in results.values():
        for region_id, consumer, t0, t1 in r["held"]:
            spans.setdefault(region_id, []).append((t0, t1, consumer))
    for region_id, held in spans.items():
        held.sort()
        for i, (_, end, a) in enumerate(held):
            for start, _, b in held[i + 1 :]:
                if start >= end:
                    break
                assert a == b, f"region {region_id} held by {a} and {b} at once"
    assert len(spans) >= 3

    with AquaClient(sock) as watcher:
        stats = watcher.stats()
        assert stats["pairings"] == []  # every allocation freed, the victim's by its disconnect
        assert len(stats["regions"]) == 3 and stats["devices"]["cpu0"]["allocated_bytes"] == 0
    for p in steady:
        p.send_signal(signal.SIGUSR1)
        assert p.wait(30) == 0
