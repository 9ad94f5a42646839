"""Fixtures for the Aqua coordinator and memory tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serving.aqua.coordinator import AquaClient, CoordinatorServer

REPO = Path(__file__).resolve().parents[2]


def wait_until(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `pred` until it is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what} not reached in time"
        time.sleep(0.02)


@pytest.fixture
def sock_path() -> Iterator[str]:
    # Unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="aqua-") as d:
        yield os.path.join(d, "coord.sock")


@pytest.fixture
def server(sock_path: str) -> Iterator[CoordinatorServer]:
    """A coordinator server running in a thread of this process."""
    srv = CoordinatorServer(sock_path)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def server_process(sock_path: str) -> Iterator[str]:
    """A standalone coordinator (`python -m serving.aqua.coordinator`); yields its socket path."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.aqua.coordinator", "--socket", sock_path],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert json.loads(line) == {"event": "listening", "socket": sock_path}
    yield sock_path
    proc.terminate()
    assert proc.wait(10) == 0


def spy_on_pending_reclaims(client: AquaClient, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set each time `client` sends pending_reclaims; clear it to wait for the next call."""
    asked = threading.Event()
    pending_reclaims = client.pending_reclaims

    def spy(consumer_id: str) -> object:
        asked.set()
        return pending_reclaims(consumer_id)

    monkeypatch.setattr(client, "pending_reclaims", spy)
    return asked


@contextlib.contextmanager
def hung(server: CoordinatorServer) -> Iterator[threading.Event]:
    """Hang `server`'s event loop (as a coordinator stuck in a call would): its socket still
    completes connections, nothing is answered. On exit (or `set()` on the yielded event) it runs on."""
    assert server._loop is not None
    entered, release = threading.Event(), threading.Event()

    def block() -> None:
        entered.set()
        release.wait(60)

    server._loop.call_soon_threadsafe(block)
    assert entered.wait(5), "the coordinator's loop did not run the blocker"
    try:
        yield release
    finally:
        release.set()


@contextlib.contextmanager
def silent_listener(path: str) -> Iterator[list[socket.socket]]:
    """A Unix socket at `path` that accepts connections and never reads or answers; yields the
    accepted connections."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    listener.settimeout(0.05)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield accepted
    finally:
        done.set()
        thread.join(5)
        listener.close()
        for conn in accepted:
            conn.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
