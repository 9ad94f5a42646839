"""A running engine that trickles its /metrics answer (a byte now and then, each well within the
HTTP client's per-read timeout) does not hold up the supervisor: a scrape is bounded as a whole,
like a /health probe, so stopping the deployment ends in about that bound and an engine process
that exits meanwhile is noticed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_agent.engines import EngineManager
from gpu_agent.engines.command import LaunchSpec
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.ports import PortAllocator
from gpu_agent.engines.supervisor import EngineSupervisor, Launcher
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus
from tests.agent.test_engine_health_trickle import ANSWER
from tests.agent.test_engines import spec
from tests.agent.ws_server import wait_for

HEALTHY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Server:
    """A local HTTP server that answers /health at once and /metrics one byte every 0.1 s."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                if not request.startswith(b"GET /metrics "):
                    writer.write(HEALTHY)
                    await writer.drain()
                    continue
                self.scrapes += 1
                for i in range(len(ANSWER)):
                    writer.write(ANSWER[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(0.1)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[Server, int]]:
    s = Server()
    listening = await asyncio.start_server(s.serve, "127.0.0.1", 0)
    try:
        yield s, listening.sockets[0].getsockname()[1]
    finally:
        listening.close()
        for w in s.writers:
            w.close()


def engine(exit_file: Path) -> Launcher:
    """An engine process that exits (code 3) once `exit_file` appears; its port is the server's."""
    wait = f"while not os.path.exists({str(exit_file)!r}): time.sleep(0.05)"
    code = f"import os, time\n{wait}\nraise SystemExit(3)"

    def launch(s: DeploymentSpec, port: int) -> LaunchSpec:
        return LaunchSpec([sys.executable, "-c", code], dict(os.environ))

    return launch


async def scraping(
    tmp_path: Path, port: int, server: Server, statuses: list[DeploymentStatus]
) -> EngineManager:
    """A manager whose engine runs, a /metrics answer to it trickling."""
    manager = EngineManager(
        engine(tmp_path / "exit"),
        str(tmp_path / "logs"),
        statuses.append,
        devices={0},
        grace_s=2.0,
        scrape_interval_s=0.1,
        liveness=Liveness(interval_s=0.2, timeout_s=0.5),
        ports=PortAllocator(lambda: port),
    )
    await manager.apply([spec()])
    await wait_for(lambda: server.scrapes > 0, 10)
    await asyncio.sleep(0.2)  # the scrape is being answered, a byte at a time
    return manager


def cancel(sup: EngineSupervisor) -> None:
    """Ends a supervision that the test found hung."""
    if sup._task is not None and not sup._task.done():
        sup._task.cancel()


@pytest.mark.asyncio
async def test_stopping_an_engine_that_trickles_its_metrics_ends_within_the_scrape_bound(
    tmp_path: Path, server: tuple[Server, int]
) -> None:
    trickler, port = server
    manager = await scraping(tmp_path, port, trickler, [])
    sup = manager.supervisor("d1")
    assert sup is not None and sup.state == "running"
    started = time.monotonic()
    try:
        await asyncio.wait_for(manager.close(), 10)  # unbounded, it took about 10000 s
    finally:
        cancel(sup)
    assert time.monotonic() - started < 5
    assert sup.state == "stopped"


@pytest.mark.asyncio
async def test_an_engine_that_exits_while_its_metrics_trickle_is_reported_failed(
    tmp_path: Path, server: tuple[Server, int]
) -> None:
    trickler, port = server
    statuses: list[DeploymentStatus] = []
    manager = await scraping(tmp_path, port, trickler, statuses)
    sup = manager.supervisor("d1")
    assert sup is not None
    try:
        (tmp_path / "exit").touch()
        # Unbounded, the scrape held the exit watch: the run stayed `running` for about 10000 s.
        await wait_for(lambda: any(s.state == "failed" for s in statuses), 5)
        failed = next(s for s in statuses if s.state == "failed")
        assert failed.error is not None and "exited with code 3" in failed.error
    finally:
        cancel(sup)
        await asyncio.wait_for(manager.close(), 10)
