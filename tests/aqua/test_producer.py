"""The lender process: lease, reclaim on a signal, wait for the consumer, unlease, unlink."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from serving.aqua.coordinator import AquaClient, UnknownRegion
from serving.aqua.memory import RegionUnavailable, open_region
from serving.aqua.producer import main as producer_main
from tests.aqua.conftest import REPO


def start_producer(sock: str, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.aqua.producer", "--socket", sock, "--nbytes", "65536", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def next_event(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    event: dict[str, Any] = json.loads(proc.stdout.readline())
    return event


@pytest.mark.usefixtures("server")
def test_it_waits_for_the_consumer_to_evacuate_before_releasing(sock_path: str) -> None:
    proc, leased = start_producer(sock_path, "--producer-id", "prod-a")
    assert leased["event"] == "leased" and leased["producer_id"] == "prod-a"
    with AquaClient(sock_path) as consumer:
        a = consumer.allocate("c1", 4096)
        assert a is not None and a.region_id == leased["region_id"]
        region = open_region(a.handle)
        region.write(a.offset, b"kv" * 2048)

        proc.send_signal(signal.SIGUSR1)
        assert next_event(proc)["event"] == "reclaiming"
        while not consumer.pending_reclaims("c1"):
            pass
        assert proc.poll() is None  # notified, not forced: still waiting for us
        evacuated = bytes(region.view(a.offset, a.nbytes))  # to the consumer's DRAM
        region.close()
        consumer.free(a.alloc_id)

        done = next_event(proc)
        assert done == {**done, "event": "reclaimed", "clean": True}
        assert proc.wait(10) == 0
        assert evacuated == b"kv" * 2048
        with pytest.raises(UnknownRegion):
            consumer.reclaim_status(a.region_id)
        with pytest.raises(RegionUnavailable):
            open_region(a.handle)  # the producer unlinked its segment


@pytest.mark.usefixtures("server")
def test_it_gives_up_after_the_timeout_and_its_region_is_withdrawn(sock_path: str) -> None:
    proc, _ = start_producer(sock_path, "--reclaim-after", "0.1", "--reclaim-timeout", "0.3")
    with AquaClient(sock_path) as consumer:
        a = consumer.allocate("c1", 100)
        assert a is not None
        assert next_event(proc)["event"] == "reclaiming"
        assert next_event(proc)["clean"] is False
        assert proc.wait(10) == 3
        (pending,) = consumer.pending_reclaims("c1")
        assert pending.withdrawn
        consumer.free(a.alloc_id)
        assert consumer.stats()["regions"] == []


@pytest.mark.usefixtures("server")
def test_it_rejects_a_bad_device_with_a_message(sock_path: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.aqua.producer",
            "--socket",
            sock_path,
            "--nbytes",
            "10",
            "--device",
            "tpu0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "tpu0" in out.stderr


@pytest.mark.parametrize(
    ("nbytes", "why"),
    [
        ("99999999999999999999", f"must be in 1..{(1 << 63) - 1}"),  # used to be an OverflowError
        ("0", "must be in 1.."),
        ("-1", "must be in 1.."),
        ("1e9", "is not a whole number of bytes"),
    ],
)
def test_it_refuses_nbytes_out_of_range_naming_the_value(
    nbytes: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        producer_main(["--socket", "/nonexistent.sock", "--nbytes", nbytes, "--device", "cuda:0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--nbytes: {nbytes!r} {why}" in err


def test_it_refuses_more_shared_memory_than_dev_shm_has_free(capsys: pytest.CaptureFixture[str]) -> None:
    st = os.statvfs("/dev/shm")
    too_many = st.f_bavail * st.f_frsize + (1 << 30)  # the segment is sparse: creating it succeeds
    with pytest.raises(SystemExit) as exit_:
        producer_main(["--socket", "/nonexistent.sock", "--nbytes", str(too_many), "--device", "cpu0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--nbytes {too_many} is more than the" in err and "/dev/shm" in err


@pytest.mark.usefixtures("server")
def test_a_huge_cpu_region_is_refused_before_anything_is_leased(sock_path: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "serving.aqua.producer", "--socket", sock_path, "--nbytes", str(1 << 50)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and f"--nbytes {1 << 50}" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    with AquaClient(sock_path) as client:
        assert client.stats()["regions"] == []


def hang_up_unlinks_its_segment(sock_path: str, *, stdout_gone: bool) -> None:
    """Start a producer in its own session, hang its process group up (SIGHUP), and check it
    exits 0 having unlinked its segment; ``stdout_gone``: its stdout is closed first."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.aqua.producer", "--socket", sock_path, "--nbytes", "65536"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if stdout_gone else None,
        text=True,
        start_new_session=True,
    )
    leased = next_event(proc)
    segment = os.path.join("/dev/shm", leased["handle"]["name"])
    assert os.path.exists(segment)
    if stdout_gone:
        assert proc.stdout is not None
        proc.stdout.close()
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        assert proc.wait(10) == 0
    finally:
        if os.path.exists(segment):
            os.unlink(segment)
            pytest.fail(f"{segment} was left in /dev/shm")


@pytest.mark.usefixtures("server")
def test_a_hang_up_of_its_process_group_unlinks_its_segment(sock_path: str) -> None:
    # A closed terminal or ssh session sends SIGHUP to the whole process group, which kills the
    # multiprocessing resource tracker too: only the producer itself can unlink the segment.
    hang_up_unlinks_its_segment(sock_path, stdout_gone=False)


@pytest.mark.usefixtures("server")
def test_it_still_unlinks_its_segment_when_its_stdout_is_gone(sock_path: str) -> None:
    # After a hang-up the terminal refuses writes (EIO), as a pipe whose reader exited does (EPIPE):
    # the events cannot be printed, but the reclaim must still run to the unlink.
    hang_up_unlinks_its_segment(sock_path, stdout_gone=True)


def test_a_coordinator_refusal_of_any_type_is_one_line_and_a_non_zero_exit(sock_path: str) -> None:
    # A coordinator that answers the hello, then refuses the lease with an error this version
    # does not know (a newer coordinator's): a plain CoordinatorError, not a ValueError/OSError.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen()

    def serve() -> None:
        conn = listener.accept()[0]
        with conn, conn.makefile("rwb") as stream:
            for reply in (
                {"ok": True, "result": {"session": "s1"}},
                {"ok": False, "error": {"code": "LeaseQuota", "message": "this host lends no more"}},
            ):
                request = json.loads(stream.readline())
                stream.write(json.dumps({"id": request["id"], **reply}).encode() + b"\n")
                stream.flush()
            stream.readline()  # until the producer hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "serving.aqua.producer", "--socket", sock_path, "--nbytes", "4096"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        listener.close()
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "error: this host lends no more\n"
    thread.join(10)
    assert not thread.is_alive()  # the producer closed its session
