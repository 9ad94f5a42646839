"""aqua-lib's client against a real coordinator server: typed errors, sessions, disconnect rule."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from serving.aqua.coordinator import (
    AquaClient,
    CoordinatorServer,
    CoordinatorUnavailable,
    InsufficientMemory,
    InvalidArgument,
    NotOwner,
    ProtocolError,
    RegionBusy,
    UnknownAllocation,
    UnknownRegion,
)
from serving.aqua.coordinator.protocol import MAX_FRAME, decode, encode
from tests.aqua.conftest import REPO, wait_until

SHM = {"kind": "shm", "name": "seg"}


def test_it_runs_the_whole_protocol_over_the_socket(server: CoordinatorServer, sock_path: str) -> None:
    with AquaClient(sock_path, name="producer") as prod, AquaClient(sock_path, name="consumer") as cons:
        r = prod.lease("p1", "cpu0", 8192, SHM)
        a = cons.allocate("c1", 1000)
        assert a is not None and a.region_id == r and a.handle == SHM
        assert cons.allocation(a.alloc_id) == a
        assert cons.allocate("c2", 10) is None
        with pytest.raises(InsufficientMemory):
            cons.allocate("c2", 10, strict=True)
        assert prod.request_reclaim(r) == "pending"
        assert [x.alloc_id for x in cons.pending_reclaims("c1")] == [a.alloc_id]
        assert not prod.wait_reclaimed(r, timeout=0.05)
        cons.free(a.alloc_id, consumer_id="c1")
        assert prod.wait_reclaimed(r, timeout=1.0)
        prod.unlease(r)
        assert cons.stats()["regions"] == []


def test_it_raises_the_coordinators_typed_errors(server: CoordinatorServer, sock_path: str) -> None:
    with AquaClient(sock_path) as prod, AquaClient(sock_path) as other:
        r = prod.lease("p1", "cpu0", 4096, SHM)
        a = other.allocate("c1", 4000)
        assert a is not None
        with pytest.raises(NotOwner):
            other.unlease(r)
        with pytest.raises(RegionBusy):
            prod.unlease(r)
        with pytest.raises(RegionBusy):
            prod.resize(r, 100)
        with pytest.raises(UnknownRegion):
            prod.reclaim_status("r404")
        with pytest.raises(NotOwner):
            other.free(a.alloc_id, consumer_id="c2")
        other.free(a.alloc_id)
        with pytest.raises(UnknownAllocation):
            other.free(a.alloc_id)
        with pytest.raises(InvalidArgument, match="nbytes"):
            prod.lease("p1", "cpu0", -1, SHM)
        prod.ping()  # the connection survives every refusal


def test_it_refuses_sizes_beyond_64_bits_that_would_end_every_stats_callers_session(
    server: CoordinatorServer, sock_path: str
) -> None:
    # JSON carries ints of up to 4300 digits; two such leases summed in stats are an int Python
    # refuses to print, and every client that asked for stats had its connection dropped.
    with AquaClient(sock_path) as prod, AquaClient(sock_path) as watcher:
        for nbytes in (9 * 10**4299, 1 << 63):
            with pytest.raises(InvalidArgument, match="nbytes"):
                prod.lease("p1", "cpu0", nbytes, SHM)
        r = prod.lease("p1", "cpu0", (1 << 63) - 1, SHM)
        prod.lease("p1", "cpu0", (1 << 63) - 1, SHM)
        with pytest.raises(InvalidArgument, match="nbytes"):
            prod.resize(r, 9 * 10**4299)
        with pytest.raises(InvalidArgument, match="nbytes"):
            watcher.allocate("c1", 1 << 63)
        assert watcher.stats()["devices"]["cpu0"]["leased_bytes"] == 2 * ((1 << 63) - 1)
        assert watcher.connected()


def test_it_refuses_handles_it_could_not_send_back_to_their_consumers(
    server: CoordinatorServer, sock_path: str
) -> None:
    # Each allocation's reply carries its region's handle: a 495-deep one overflowed the
    # recursion limit, three copies of a 400 kB one the frame limit, and the consumer asking for
    # them had its connection dropped (its allocations freed) instead of an answer.
    nested: list[object] = []
    for _ in range(495):
        nested = [nested]
    with AquaClient(sock_path) as prod, AquaClient(sock_path) as cons:
        for handle in ({"kind": "shm", "x": nested}, {"kind": "shm", "blob": "x" * 400_000}):
            with pytest.raises(InvalidArgument, match="handle"):
                prod.lease("p1", "cpu0", 1 << 20, handle)
        r = prod.lease("p1", "cpu0", 1 << 20, {"kind": "shm", "ipc": {"a": [[1], [2]]}})
        for _ in range(3):
            assert cons.allocate("c1", 4096) is not None
        prod.request_reclaim(r)
        assert len(cons.pending_reclaims("c1")) == 3
        assert cons.connected()


def test_it_answers_a_reply_too_large_to_send_with_an_error_and_keeps_the_session(
    server: CoordinatorServer, sock_path: str
) -> None:
    # The stats of 3000 regions exceed the frame limit: the server's handler raised, and the
    # client that asked (any watcher) lost its session and its allocations.
    with AquaClient(sock_path) as prod, AquaClient(sock_path) as cons:
        prod.lease("p1", "cpu0", 4096, SHM)
        a = cons.allocate("c1", 100)
        assert a is not None
        server.call(lambda c: [c.lease("p" * 200, "cpu0", 4096, SHM) for _ in range(3000)])
        with pytest.raises(ProtocolError, match="could not be sent"):
            cons.stats()
        assert cons.allocation(a.alloc_id) == a
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(sock_path)
    f = raw.makefile("rb")
    raw.sendall(encode({"id": "x" * (MAX_FRAME - 100), "op": "stats"}))  # even its error is too large
    reply = decode(f.readline())
    assert reply["id"] is None and reply["error"]["code"] == "ProtocolError"
    raw.sendall(encode({"id": 2, "op": "ping"}))
    assert decode(f.readline()) == {"id": 2, "ok": True, "result": "pong"}
    raw.close()


def test_it_refuses_names_too_long_to_send_back_in_every_allocation(
    server: CoordinatorServer, sock_path: str
) -> None:
    # Every allocation carries its producer id: with a 300 kB one, four allocations made a
    # pending_reclaims reply over the frame limit, and their consumer could never learn what to
    # give back (its session lost, before replies too large were answered with an error).
    long, longest = "x" * 300_000, 1024  # the coordinator's MAX_NAME
    with AquaClient(sock_path) as prod, AquaClient(sock_path) as cons:
        with pytest.raises(InvalidArgument, match="producer_id"):
            prod.lease(long, "cpu0", 4096, SHM)
        with pytest.raises(InvalidArgument, match="device"):
            prod.lease("p1", long, 4096, SHM)
        with pytest.raises(InvalidArgument, match="consumer_id"):
            cons.allocate(long, 100)
        with pytest.raises(InvalidArgument, match="device_hint"):
            cons.allocate("c1", 100, long)
        assert cons.stats()["regions"] == []
        r = prod.lease("p" * longest, "d" * longest, 1 << 20, SHM)
        for _ in range(4):
            assert cons.allocate("c" * longest, 4096) is not None
        prod.request_reclaim(r)
        assert len(cons.pending_reclaims("c" * longest)) == 4


def test_it_rejects_malformed_frames_without_dropping_the_connection(
    server: CoordinatorServer, sock_path: str
) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    f = s.makefile("rb")
    for raw, code in [
        (b"not json\n", "ProtocolError"),
        (b"[1, 2]\n", "ProtocolError"),
        (b"[" * 200_000 + b"]" * 200_000 + b"\n", "ProtocolError"),  # json.loads: RecursionError
        (encode({"id": 1, "op": "format_disk"}), "InvalidArgument"),
        (encode({"id": 2, "op": "lease", "args": {"session": "s1"}}), "InvalidArgument"),
        (encode({"id": 3, "op": "lease", "args": {"producer_id": "p"}}), "InvalidArgument"),
        (encode({"id": 4, "op": "free", "args": {"alloc_id": ["x"]}}), "InvalidArgument"),
        (encode({"id": 5, "op": "free", "args": {"alloc_id": "a99"}}), "UnknownAllocation"),
    ]:
        s.sendall(raw)
        reply = decode(f.readline())
        assert not reply["ok"] and reply["error"]["code"] == code
    s.sendall(encode({"id": 6, "op": "ping"}))
    assert decode(f.readline()) == {"id": 6, "ok": True, "result": "pong"}
    s.close()


def test_it_frees_allocations_and_withdraws_leases_of_a_closed_client(
    server: CoordinatorServer, sock_path: str
) -> None:
    watcher = AquaClient(sock_path)
    prod = AquaClient(sock_path)
    cons = AquaClient(sock_path)
    r_busy = prod.lease("p1", "cpu0", 4096, SHM)
    r_empty = prod.lease("p1", "cpu0", 4096, SHM)
    a = cons.allocate("c1", 100)
    assert a is not None
    prod.close()
    wait_until(lambda: len(watcher.stats()["regions"]) == 1)
    with pytest.raises(UnknownRegion):
        watcher.reclaim_status(r_empty)
    (pending,) = watcher.pending_reclaims("c1")
    assert pending.withdrawn and pending.region_id == r_busy
    cons.close()
    wait_until(lambda: watcher.stats()["regions"] == [])
    watcher.close()


def test_it_cleans_up_after_a_killed_client_process(server_process: str) -> None:
    code = (
        "import sys, time\n"
        "from serving.aqua.coordinator import AquaClient\n"
        "c = AquaClient(sys.argv[1])\n"
        "r = c.lease('p-dead', 'cpu0', 4096, {'kind': 'shm', 'name': 'x'})\n"
        "assert c.allocate('c-dead', 100) is not None\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, server_process], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    with AquaClient(server_process) as watcher:
        assert watcher.stats()["pairings"][0]["consumer_id"] == "c-dead"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: watcher.stats()["regions"] == [])


def test_it_refuses_a_client_used_after_fork(server: CoordinatorServer, sock_path: str) -> None:
    client = AquaClient(sock_path)
    pid = os.fork()
    if pid == 0:  # child: must refuse, never talk on the parent's connection
        try:
            client.ping()
        except CoordinatorUnavailable:
            os._exit(0)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.ping()
    client.close()


def test_a_forked_child_does_not_keep_its_parents_session_open(
    server: CoordinatorServer, sock_path: str
) -> None:
    lender = AquaClient(sock_path, name="lender")
    lender.lease("p", "cpu0", 4096, SHM)
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child (a worker, a compile pool): outlives the lender, never uses its client
        os.close(go_w)
        os.read(go_r, 1)
        os._exit(0 if not lender.connected() else 1)
    os.close(go_r)
    try:
        with AquaClient(sock_path) as watcher:
            lender.close()  # the lender is gone: its lease must be withdrawn now
            wait_until(lambda: watcher.stats()["regions"] == [], timeout=3.0, what="the withdrawal")
    finally:
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_it_refuses_to_start_over_a_hung_server_whose_backlog_is_full(sock_path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a hung server: never accepts
    listener.bind(sock_path)
    listener.listen(0)
    queued: list[socket.socket] = []
    try:
        while True:  # fill its backlog
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setblocking(False)
            queued.append(conn)
            try:
                conn.connect(sock_path)
            except BlockingIOError:
                break
        second = CoordinatorServer(sock_path)
        with pytest.raises(RuntimeError, match="already listening"):
            second.start(timeout=3.0)
        assert second._thread is not None
        second._thread.join(3.0)
        assert not second._thread.is_alive()  # not left blocked in a connect
        assert os.path.exists(sock_path)  # the live server's socket is kept
    finally:
        for conn in queued:
            conn.close()
        listener.close()


def test_something_else_on_the_path_is_no_coordinator_not_a_crash(sock_path: str) -> None:
    from serving.aqua.coordinator.session import CoordinatorSession

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # another program on the path
    listener.bind(sock_path)
    listener.listen()
    conns: list[socket.socket] = []

    def answer_garbage() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn = listener.accept()[0]
                conns.append(conn)
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 400 Bad Request\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        with pytest.raises(CoordinatorUnavailable, match="did not answer as a coordinator"):
            AquaClient(sock_path, connect_timeout=0)
        # The session (an engine's watcher thread, a lender) backs off instead of raising.
        assert CoordinatorSession(sock_path).ensure() is None
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
        for conn in conns:
            conn.close()


def test_it_fails_fast_with_a_typed_error_when_no_server_listens(sock_path: str) -> None:
    with pytest.raises(CoordinatorUnavailable):
        AquaClient(sock_path, connect_timeout=0.2)


def test_it_refuses_to_start_over_a_live_server(server: CoordinatorServer, sock_path: str) -> None:
    second = CoordinatorServer(sock_path)
    with pytest.raises(RuntimeError, match="already listening"):
        second.start()
    with AquaClient(sock_path) as c:  # the first one still serves
        c.ping()


def test_it_replaces_a_stale_socket_file(sock_path: str) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock_path)
    stale.close()  # a file nobody listens on, as a crashed server leaves it
    srv = CoordinatorServer(sock_path)
    srv.start()
    with AquaClient(sock_path) as c:
        c.ping()
    srv.stop()
    assert not os.path.exists(sock_path)


def test_it_reports_connection_loss_as_unavailable(sock_path: str) -> None:
    srv = CoordinatorServer(sock_path)
    srv.start()
    client = AquaClient(sock_path)
    srv.stop()
    with pytest.raises(CoordinatorUnavailable):
        client.allocate("c1", 10)


def test_connected_tells_a_live_session_from_a_lost_one_without_a_round_trip(sock_path: str) -> None:
    srv = CoordinatorServer(sock_path)
    srv.start()
    client, other = AquaClient(sock_path), AquaClient(sock_path)
    client.ping()
    t0 = time.monotonic()
    assert client.connected() and client.connected()  # idle and up: no wait for a reply
    assert time.monotonic() - t0 < 1.0
    other.close()
    assert not other.connected()
    srv.stop()  # the server closes every session
    assert not client.connected()
    with pytest.raises(CoordinatorUnavailable):
        client.ping()


def test_it_times_out_on_a_server_that_never_answers(sock_path: str) -> None:
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(sock_path)
    mute.listen()  # connections complete in the backlog; nothing is ever read or answered
    t0 = time.monotonic()
    with pytest.raises(CoordinatorUnavailable, match="timed out"):
        AquaClient(sock_path, timeout=0.3)
    assert time.monotonic() - t0 < 5
    mute.close()


def test_it_refuses_oversized_frames(server: CoordinatorServer, sock_path: str) -> None:
    with AquaClient(sock_path) as client:
        with pytest.raises(ProtocolError, match="exceeds"):
            client.lease("p1", "cpu0", 10, {"kind": "shm", "blob": "x" * MAX_FRAME})
        client.ping()  # refused before sending: the connection is intact
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(sock_path)
    f = raw.makefile("rb")
    lease = {"producer_id": "p1", "device": "cpu0", "nbytes": 10, "handle": SHM}
    raw.sendall(encode({"id": 1, "op": "lease", "args": lease}))
    region_id = decode(f.readline())["result"]
    raw.sendall(b"x" * (MAX_FRAME + 10) + b"\n")
    assert decode(f.readline())["error"]["code"] == "ProtocolError"
    # The oversized frame is dropped, not the session: its lease stands and it is still answered.
    raw.sendall(encode({"id": 2, "op": "reclaim_status", "args": {"region_id": region_id}}))
    assert decode(f.readline()) == {"id": 2, "ok": True, "result": "none"}
    raw.close()


def test_it_stops_promptly_though_a_client_never_reads_its_replies(sock_path: str) -> None:
    # Closing a connection flushes its unsent replies first: one whose peer never read them held
    # stop() for the 5 s the server waits on its handlers, past the host agent's 2 s stop timeout
    # (which then reported the coordinator stuck and hung up on every client from outside).
    srv = CoordinatorServer(sock_path)
    srv.start()
    with AquaClient(sock_path) as reader:
        hog = socket.socket(socket.AF_UNIX)
        hog.connect(sock_path)
        hog.setblocking(False)
        request = encode({"id": 1, "op": "x" * 4000})  # each is answered with its op echoed
        blocked_since = None
        while blocked_since is None or time.monotonic() - blocked_since < 0.5:
            try:
                hog.send(request)
                blocked_since = None
            except BlockingIOError:
                blocked_since = blocked_since or time.monotonic()
                time.sleep(0.01)
        reader.ping()  # the server is blocked on the hog's replies only
        t0 = time.monotonic()
        assert srv.stop(timeout=2.0)
        assert time.monotonic() - t0 < 2.0
        assert not reader.connected()
        hog.close()


def test_it_runs_functions_on_the_servers_loop_for_an_in_process_host(
    server: CoordinatorServer, sock_path: str
) -> None:
    with AquaClient(sock_path) as client:
        client.lease("p1", "cuda:0", 4096, SHM)
        devices = server.call(lambda c: c.stats()["devices"])
        assert devices["cuda:0"]["leased_bytes"] == 4096
        assert server.call(lambda c: c.allocate("agent-local", 100)) is not None
        assert client.stats()["pairings"][0]["consumer_id"] == "agent-local"
