"""Fixtures for the Aqua coordinator and memory tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serving.aqua.coordinator import CoordinatorServer

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
