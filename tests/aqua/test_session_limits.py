"""Per-session caps: one client session cannot lease or allocate without end (the coordinator's
memory, and the time of every allocate and stats call, grew with what it held); a session at its
cap gets a SessionLimit naming the cap while other sessions go on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serving.aqua.coordinator import (
    AquaClient,
    Coordinator,
    CoordinatorServer,
    SessionLimit,
    SessionLimits,
)
from serving.aqua.coordinator.coordinator import LOCAL_SESSION
from tests.aqua.conftest import REPO

SHM = {"kind": "shm", "name": "seg"}


def test_it_caps_the_leases_of_one_session_and_not_of_another() -> None:
    c = Coordinator(SessionLimits(max_leases=2))
    first = c.lease("p1", "cpu0", 4096, SHM, session="P")
    c.lease("p1", "cpu1", 4096, SHM, session="P")
    with pytest.raises(SessionLimit, match=r"session P holds 2 leases: the limit is max_leases=2"):
        c.lease("p1", "cpu2", 4096, SHM, session="P")
    c.lease("p2", "cpu0", 4096, SHM, session="Q")  # another session is unaffected
    c.unlease(first, session="P")
    c.lease("p1", "cpu2", 4096, SHM, session="P")  # back under the cap
    c.check_invariants()


def test_it_caps_the_allocations_of_one_session_until_it_frees_or_disconnects() -> None:
    c = Coordinator(SessionLimits(max_allocations=3))
    c.lease("p1", "cpu0", 1 << 20, SHM, session="P")
    c.lease("p2", "cpu0", 1 << 20, SHM, session="P")
    got = [c.allocate("c1", 100, session="C") for _ in range(3)]
    assert all(a is not None for a in got)
    with pytest.raises(SessionLimit, match=r"holds 3 allocations: the limit is max_allocations=3"):
        c.allocate("c1", 100, session="C")
    assert c.allocate("c2", 100, session="D") is not None  # another session, the other region
    first = got[0]
    assert first is not None
    c.free(first.alloc_id, session="D")  # freed by another session: the maker's count drops
    assert c.allocate("c1", 100, session="C") is not None
    c.check_invariants()
    c.disconnect("C")
    assert [c.allocate("c1", 100, session="C2") for _ in range(3)].count(None) == 0
    c.check_invariants()


def test_a_withdrawn_region_no_longer_counts_against_its_session() -> None:
    c = Coordinator(SessionLimits(max_leases=1))
    c.lease("p1", "cpu0", 4096, SHM, session="P")
    assert c.allocate("c1", 100, session="C") is not None
    c.disconnect("P")  # withdrawn, still held by c1
    c.check_invariants()
    c.lease("p1", "cpu0", 4096, SHM, session="P")  # a session name is never reused; still no count
    c.check_invariants()


def test_the_in_process_host_is_not_capped() -> None:
    c = Coordinator(SessionLimits(max_leases=1, max_allocations=1))
    for _ in range(3):
        c.lease("host", "cpu0", 4096, SHM, session=LOCAL_SESSION)
        assert c.allocate("c1", 100, session=LOCAL_SESSION) is not None


@pytest.mark.parametrize("kwargs", [{"max_leases": 0}, {"max_allocations": -1}, {"max_leases": True}])
def test_it_refuses_limits_that_are_not_positive_integers(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SessionLimits(**kwargs)  # type: ignore[arg-type]


def test_the_refusal_crosses_the_socket_and_the_session_goes_on(sock_path: str) -> None:
    server = CoordinatorServer(sock_path, Coordinator(SessionLimits(max_allocations=2)))
    server.start()
    try:
        with AquaClient(sock_path) as prod, AquaClient(sock_path) as greedy, AquaClient(sock_path) as other:
            prod.lease("p1", "cpu0", 1 << 20, SHM)
            prod.lease("p2", "cpu0", 1 << 20, SHM)
            kept = [greedy.allocate("c1", 100) for _ in range(2)]
            with pytest.raises(SessionLimit, match="max_allocations=2"):
                greedy.allocate("c1", 100)
            assert greedy.connected() and [greedy.allocation(a.alloc_id) for a in kept if a] == kept
            assert other.allocate("c2", 100) is not None
    finally:
        server.stop()


def test_the_standalone_coordinator_takes_the_caps_as_options(sock_path: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.aqua.coordinator",
            "--socket",
            sock_path,
            "--max-leases-per-session",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "listening"
        with AquaClient(sock_path) as prod:
            prod.lease("p1", "cpu0", 4096, SHM)
            with pytest.raises(SessionLimit, match="max_leases=1"):
                prod.lease("p1", "cpu1", 4096, SHM)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
