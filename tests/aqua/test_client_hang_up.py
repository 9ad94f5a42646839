"""The client lets go of its connection whenever its session is over: the server closed it, or a
reply came out of step with its request. Closing the socket alone used to leave the descriptor
open (the reader made by `makefile` holds it), so the connection, and on a live server the
session with its allocations, stayed until the client was garbage-collected. And `connected()`
works whatever the socket's descriptor number."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serving.aqua.coordinator import AquaClient, CoordinatorServer, CoordinatorUnavailable, ProtocolError

Reply = Callable[[dict[str, Any]], bytes | None]  # request -> reply line, or None to hang up


@contextlib.contextmanager
def scripted_server(path: str, replies: list[Reply]) -> Iterator[dict[str, bytes]]:
    """A one-connection server answering its requests in turn with `replies`; once they run out
    (or one returns None) it closes, or, when the client hangs up first, records b"" as "eof"."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    seen: dict[str, bytes] = {}

    def serve() -> None:
        conn = listener.accept()[0]
        conn.settimeout(10)
        with conn, conn.makefile("rb") as reader:
            for reply in replies:
                line = reader.readline()
                if not line:
                    seen["eof"] = b""
                    return
                out = reply(json.loads(line))
                if out is None:
                    return
                conn.sendall(out)
            with contextlib.suppress(TimeoutError):
                seen["eof"] = reader.readline()  # b"" once the client hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        thread.join(15)
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def answer(result: object, id_offset: int = 0) -> Reply:
    def reply(req: dict[str, Any]) -> bytes:
        return json.dumps({"id": req["id"] + id_offset, "ok": True, "result": result}).encode() + b"\n"

    return reply


def hello() -> Reply:
    return answer({"session": "s1"})


def _open_socket_fds(inode: int) -> list[str]:
    """This process's descriptors on the socket with `inode`."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == f"socket:[{inode}]":
                fds.append(fd)
    return fds


def test_it_lets_go_of_its_socket_once_the_server_has_closed_it(sock_path: str) -> None:
    with scripted_server(sock_path, [hello(), answer("pong"), lambda req: None]):
        client = AquaClient(sock_path, connect_timeout=5)
        inode = os.fstat(client._sock.fileno()).st_ino
        client.ping()
        with pytest.raises(CoordinatorUnavailable, match="closed the connection"):
            client.ping()
        assert _open_socket_fds(inode) == []
        assert not client.connected()
        with pytest.raises(CoordinatorUnavailable, match="closed"):
            client.ping()


def test_it_hangs_up_on_a_reply_out_of_step_with_its_request(sock_path: str) -> None:
    with scripted_server(sock_path, [hello(), answer("pong", id_offset=1)]) as seen:
        client = AquaClient(sock_path, connect_timeout=5)
        with pytest.raises(ProtocolError, match="does not match"):
            client.ping()
        assert not client.connected()
        with pytest.raises(CoordinatorUnavailable, match="closed"):
            client.ping()  # not the next reply of a stream out of step
    assert seen.get("eof") == b""  # the server saw the session end


def test_it_hangs_up_on_a_reply_it_cannot_decode(sock_path: str) -> None:
    with scripted_server(sock_path, [hello(), lambda req: b"not json\n"]) as seen:
        client = AquaClient(sock_path, connect_timeout=5)
        with pytest.raises(ProtocolError, match="undecodable"):
            client.ping()
        assert not client.connected()
    assert seen.get("eof") == b""


def test_connected_works_for_a_socket_numbered_above_select_s_limit(sock_path: str) -> None:
    # An engine process holding many files gets descriptors from 1024 up, which select() refuses
    # (ValueError): every reserve/get/poll of the lent store, which asks connected(), raised.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit ({hard}) is under 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers: list[int] = []
    try:
        while not fillers or fillers[-1] < 1100:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        server = CoordinatorServer(sock_path)
        server.start()
        try:
            with AquaClient(sock_path) as client:
                assert client._sock.fileno() > 1024
                assert client.connected()
                server.stop()  # the server ends every session
                assert not client.connected()
        finally:
            server.stop()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf")])
def test_a_bad_reply_timeout_is_refused_before_any_session_is_opened(
    server: CoordinatorServer, sock_path: str, timeout: float
) -> None:
    # settimeout refused -1 and nan only once connected, and the connection stayed open (a session
    # on the server) until the client was collected; 0 made every call fail as if no one answered.
    with pytest.raises(ValueError, match="timeout="):
        AquaClient(sock_path, timeout=timeout)
    with AquaClient(sock_path) as client:
        assert client.stats()["sessions"] == 1  # only this one


def test_an_error_reply_without_its_fields_is_no_coordinator_not_a_crash(sock_path: str) -> None:
    # {"error": "boom"} raised AttributeError out of the constructor, which CoordinatorSession's
    # backoff does not catch (an engine's watcher thread died of it), with the socket left open.
    def boom(req: dict[str, Any]) -> bytes:
        return json.dumps({"id": req["id"], "ok": False, "error": "boom"}).encode() + b"\n"

    refused = pytest.raises(CoordinatorUnavailable, match="did not answer as a coordinator")
    with scripted_server(sock_path, [boom]) as seen, refused:
        AquaClient(sock_path, connect_timeout=5)
    assert seen.get("eof") == b""
