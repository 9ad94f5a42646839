"""A producer killed with its whole process group (SIGKILL: no unlink runs, and the resource
tracker dies with it) used to leave its /dev/shm segment for ever. Segment names now record their
owner (pid, start time, pid namespace); a producer or coordinator that starts unlinks the segments
of dead owners, and nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from serving.aqua.coordinator import CoordinatorServer
from serving.aqua.memory.shm import ShmRegion
from serving.aqua.memory.shm_names import SHM_DIR, pid_namespace, process_start, sweep_stale_segments
from tests.aqua.conftest import REPO

pytestmark = pytest.mark.skipif(
    pid_namespace() is None or not os.path.isdir(SHM_DIR), reason="needs /proc and /dev/shm"
)


@pytest.fixture
def planted() -> Iterator[list[str]]:
    """Segment files a test plants in /dev/shm; those still there are removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        if os.path.exists(os.path.join(SHM_DIR, name)):
            os.unlink(os.path.join(SHM_DIR, name))


def plant(planted: list[str], name: str) -> str:
    with open(os.path.join(SHM_DIR, name), "wb") as f:
        f.write(b"x" * 4096)
    planted.append(name)
    return name


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    return proc.pid


def killed_producer(sock_path: str) -> str:
    """Start a producer in its own process group, SIGKILL the group once it has leased; returns
    the name of the segment it leaves behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.aqua.producer", "--socket", sock_path, "--nbytes", "65536"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert '"leased"' in line, line
    name = str(json.loads(line)["handle"]["name"])
    os.killpg(proc.pid, signal.SIGKILL)  # the resource tracker, its child, dies too
    assert proc.wait(10) == -signal.SIGKILL
    proc.stdout.close()
    assert exists(name), "the killed producer's segment should be left behind"
    return name


def test_a_starting_producer_unlinks_the_segment_of_one_killed_with_its_group(
    server: CoordinatorServer, sock_path: str, planted: list[str]
) -> None:
    leftover = killed_producer(sock_path)
    planted.append(leftover)
    live = ShmRegion.create(4096)  # a live owner's (this process's) segment
    try:
        # A new producer starts: it sweeps before it leases.
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving.aqua.producer", "--socket", sock_path, "--nbytes", "65536"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert '"leased"' in line, line
        assert not exists(leftover)
        assert exists(live.name)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        proc.stdout.close()
    finally:
        live.close()


def test_a_starting_coordinator_unlinks_the_segment_of_a_killed_producer(
    sock_path: str, planted: list[str]
) -> None:
    first = CoordinatorServer(sock_path)
    first.start()
    try:
        leftover = killed_producer(sock_path)
        planted.append(leftover)
    finally:
        first.stop()
    second = CoordinatorServer(sock_path)  # the host agent restarts its coordinator
    second.start()
    second.stop()
    assert not exists(leftover)


def test_the_sweep_leaves_every_segment_it_cannot_prove_dead(planted: list[str]) -> None:
    ns = pid_namespace()
    assert ns is not None
    me, start = os.getpid(), process_start(os.getpid())
    assert start is not None
    gone = dead_pid()
    swept = {
        plant(planted, f"aqua_{gone}_{start:x}_{ns:x}_0000000a"),  # its owner has exited
        plant(planted, f"aqua_{me}_{start + 1:x}_{ns:x}_0000000b"),  # pid reused: another process
    }
    kept = {
        plant(planted, f"aqua_{me}_{start:x}_{ns:x}_0000000c"),  # this live process's
        plant(planted, f"aqua_{gone}_{start:x}_{ns + 1:x}_0000000d"),  # another pid namespace
        plant(planted, f"aqua_{gone}_0123456789ab"),  # the pid-only scheme: owner unprovable
        plant(planted, f"other_{gone}_{start:x}_{ns:x}_0000000e"),  # not our prefix
    }
    assert set(sweep_stale_segments()) >= swept  # other dead owners' segments may go too
    assert {n for n in swept | kept if exists(n)} == kept


def test_a_zombie_owner_counts_as_dead(planted: list[str]) -> None:
    ns = pid_namespace()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        start = process_start(proc.pid)  # alive until its stdin closes
        assert start is not None and ns is not None
        name = plant(planted, f"aqua_{proc.pid}_{start:x}_{ns:x}_0000000f")
        assert name not in sweep_stale_segments()
        assert proc.stdin is not None
        proc.stdin.close()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert name in sweep_stale_segments()
    finally:
        proc.wait(10)
