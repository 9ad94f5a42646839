"""`AquaClient.connected()` never waits for another thread's call: an engine's step checks its
lent store's session (poll, get, reserve) while the store's watcher may be waiting up to a call
timeout on a slow coordinator's reply, on the same client."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator

import pytest
import torch

from serving.aqua.coordinator import AquaClient, CoordinatorServer, CoordinatorUnavailable
from serving.aqua.offload.lent import LentRegionStore
from serving.aqua.producer import LenderAgent
from tests.aqua.conftest import hung, spy_on_pending_reclaims, wait_until

NBYTES = 1 << 16
SLOW_S = 10.0  # the call timeout here: how long a check made under the old lock waited


def test_connected_answers_at_once_while_another_threads_call_waits_for_its_reply(
    server: CoordinatorServer, sock_path: str
) -> None:
    client = AquaClient(sock_path, timeout=SLOW_S)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.ping()
        except BaseException as exc:
            errors.append(exc)

    try:
        with hung(server):
            caller = threading.Thread(target=call)
            caller.start()
            wait_until(client._lock.locked, 5, "the call in flight")
            assert client.connected()
            assert client._lock.locked() and caller.is_alive()  # it did not wait for the reply
        caller.join(SLOW_S + 5)
        assert errors == [] and client.connected()
    finally:
        client.close()


@pytest.fixture
def answers_hello(sock_path: str) -> Iterator[list[socket.socket]]:
    """A fake coordinator that answers the hello and nothing after; yields its connections."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen()
    conns: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn = listener.accept()[0]
            frame = b""
            while not frame.endswith(b"\n"):  # the hello (recv, not a reader: close() must close)
                frame += conn.recv(4096)
            request = json.loads(frame)
            conn.sendall(
                json.dumps({"id": request["id"], "ok": True, "result": {"session": "s1"}}).encode() + b"\n"
            )
            conns.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield conns
    listener.close()
    for conn in conns:
        conn.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)


def test_connected_sees_a_hang_up_while_another_threads_call_holds_the_connection(
    answers_hello: list[socket.socket], sock_path: str
) -> None:
    client = AquaClient(sock_path, timeout=SLOW_S)
    seen: list[bool] = []
    try:
        wait_until(lambda: answers_hello, 5, "the fake coordinator's connection")
        with client._lock:  # as a call waiting for its reply holds it
            assert _connected_from_another_thread(client, seen) == [True]
            answers_hello[0].close()  # the coordinator ends the session
            assert _connected_from_another_thread(client, seen) == [True, False]
    finally:
        client.close()
    assert not client.connected()


def _connected_from_another_thread(client: AquaClient, seen: list[bool]) -> list[bool]:
    checker = threading.Thread(target=lambda: seen.append(client.connected()), daemon=True)
    checker.start()
    checker.join(SLOW_S)  # a check that waited for the lock would never return here
    return seen


def test_an_engine_step_reads_its_lent_data_while_the_watcher_waits_on_a_slow_coordinator(
    server: CoordinatorServer, sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lender = LenderAgent(sock_path, "cpu0", NBYTES, producer_id="prod")
    lender.lend()
    store = LentRegionStore(sock_path, "cons", NBYTES, retry_seconds=0.05, call_timeout_s=SLOW_S)
    try:
        buf = store.reserve("req-1", 4096)
        assert buf is not None
        data = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
        buf.copy_(data)
        client = store._alloc_client
        assert client is not None
        asked = spy_on_pending_reclaims(client, monkeypatch)
        with hung(server):
            # The watcher's next pending_reclaims (sent now: it waits for its reply)
            asked.clear()
            assert asked.wait(5)
            wait_until(client._lock.locked, 5, "the watcher's call in flight")
            assert store.poll() == []  # the step's checks
            got = store.get("req-1")
            assert got is not None and torch.equal(got, data)
            assert client._lock.locked()  # the watcher still waits: the step did not
            assert store.sessions_lost == 0
    finally:
        store.close()
        lender.close()
    with pytest.raises(CoordinatorUnavailable):
        client.ping()  # closed with the store
