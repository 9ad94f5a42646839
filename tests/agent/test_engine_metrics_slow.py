"""A /metrics scrape waits as long as a /health probe may: the liveness timeout, as a whole. vLLM
serves both from the event loop that serves requests, so an engine busy for longer than the HTTP
client's 5 s per-read default, within a liveness timeout set for it, answers its probes; its scrape
gave up at 5 s all the same (though bounded by the liveness timeout), so its telemetry stood still
for as long as it stayed that busy, and each abandoned scrape was one more request for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_agent.engines import EngineManager
from gpu_agent.engines.liveness import Liveness
from gpu_agent.engines.ports import PortAllocator
from tests.agent.test_engine_metrics_trickle import HEALTHY, engine
from tests.agent.test_engines import spec
from tests.agent.ws_server import wait_for

BUSY_S = 5.5  # longer than the engine HTTP client's per-read timeout (5 s)
METRICS = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 7\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(METRICS), METRICS)


class BusyEngine:
    """A local HTTP server that answers /health at once and /metrics after `BUSY_S` silent seconds."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                if request.startswith(b"GET /metrics "):
                    self.scrapes += 1
                    await asyncio.sleep(BUSY_S)
                writer.write(ANSWER if request.startswith(b"GET /metrics ") else HEALTHY)
                await writer.drain()


@pytest_asyncio.fixture
async def busy() -> AsyncIterator[tuple[BusyEngine, int]]:
    s = BusyEngine()
    listening = await asyncio.start_server(s.serve, "127.0.0.1", 0)
    try:
        yield s, listening.sockets[0].getsockname()[1]
    finally:
        listening.close()
        for w in s.writers:
            w.close()


@pytest.mark.asyncio
async def test_a_scrape_waits_for_a_busy_engine_within_the_liveness_timeout(
    tmp_path: Path, busy: tuple[BusyEngine, int]
) -> None:
    server, port = busy
    manager = EngineManager(
        engine(tmp_path / "exit"),
        str(tmp_path / "logs"),
        lambda status: None,
        devices={0},
        grace_s=2.0,
        scrape_interval_s=0.1,
        liveness=Liveness(interval_s=0.5, timeout_s=8.0),
        ports=PortAllocator(lambda: port),
    )
    try:
        await manager.apply([spec()])
        sup = manager.supervisor("d1")
        assert sup is not None
        await wait_for(lambda: server.scrapes > 0, 10)
        # Cut at 5 s, the first scrape failed and the second was answered 5.5 s after it, at 11 s.
        await wait_for(lambda: sup.take_sample().running == 7, BUSY_S + 2)
        assert server.scrapes == 1  # none abandoned
    finally:
        await asyncio.wait_for(manager.close(), 10)
