"""A starting engine that trickles its /health answer (a byte now and then, each well within the
HTTP client's per-read timeout) does not hold up the agent: each /health request is bounded as a
whole, like the liveness probe's, so stopping the deployment ends in about that bound."""

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
from gpu_agent.protocol import DeploymentSpec
from tests.agent.test_engines import spec

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000


class Trickler:
    """A local HTTP server that answers every request one byte every `every_s` seconds."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.every_s = every_s
        self.requests = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            for i in range(len(ANSWER)):
                writer.write(ANSWER[i : i + 1])
                await writer.drain()
                await asyncio.sleep(self.every_s)


@pytest_asyncio.fixture
async def trickler() -> AsyncIterator[tuple[Trickler, int]]:
    t = Trickler()
    server = await asyncio.start_server(t.serve, "127.0.0.1", 0)
    try:
        yield t, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for w in t.writers:
            w.close()


def sleeper(s: DeploymentSpec, port: int) -> LaunchSpec:
    """An engine process that never answers itself: its port is the trickling server's."""
    return LaunchSpec([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))


@pytest.mark.asyncio
async def test_stopping_an_engine_that_trickles_its_health_answer_ends_within_the_probe_bound(
    tmp_path: Path, trickler: tuple[Trickler, int]
) -> None:
    server, port = trickler
    manager = EngineManager(
        sleeper,
        str(tmp_path / "logs"),
        lambda s: None,
        devices={0},
        grace_s=2.0,
        liveness=Liveness(timeout_s=0.5),
        ports=PortAllocator(lambda: port),
    )
    await manager.apply([spec()])
    sup = manager.supervisor("d1")
    assert sup is not None
    deadline = time.monotonic() + 10
    while server.requests == 0 or sup.state != "starting":
        assert time.monotonic() < deadline, "no /health request came"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # the request is being answered, a byte at a time
    started = time.monotonic()
    try:
        await asyncio.wait_for(manager.close(), 10)  # unbounded, it took about 10000 s
    finally:
        if sup._task is not None and not sup._task.done():
            sup._task.cancel()
    assert time.monotonic() - started < 5
    assert sup.state == "stopped"
