"""A host whose environment names an HTTP proxy (HTTP_PROXY, ALL_PROXY: common on GPU clusters,
for weights downloads) without the engines' address in NO_PROXY: the agent still reaches its own
engines directly. httpx follows those variables by default, so /health, /metrics and probe replays
went to the proxy, which cannot reach this host's engines: every engine was stopped as never
healthy and started again, for ever."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from gpu_agent.probe import ProbeRunner
from gpu_agent.protocol import DeploymentStatus
from tests.agent.test_engines import fake_launcher, manager, spec
from tests.agent.ws_server import wait_for
from tests.planning.test_probe_runner import engine, probe  # noqa: F401 (a fixture)
from tests.planning.test_probe_runner import spec as probe_spec


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"  # a proxy nothing answers on
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.asyncio
@pytest.mark.usefixtures("proxied")
async def test_an_engine_is_reached_directly_whatever_proxy_the_environment_names(tmp_path: Path) -> None:
    statuses: list[DeploymentStatus] = []
    m = manager(tmp_path, fake_launcher(tmp_path / "pids"), statuses, scrape_interval_s=0.05)
    try:
        await m.apply([spec()])
        await wait_for(lambda: [s.state for s in statuses] == ["starting", "running"], timeout=15)
        sup = m.supervisor("d1")
        assert sup is not None
        await wait_for(lambda: m.take_samples()[0].running == 3)  # its /metrics, scraped
    finally:
        await m.close()


@pytest.mark.usefixtures("proxied")
def test_a_probe_replays_against_the_engine_directly(engine: str, tmp_path: Path) -> None:  # noqa: F811
    report = asyncio.run(
        ProbeRunner(engine, probe_spec(tmp_path), sample_interval_s=0.02).run(probe((0.0, 8, 2)))
    )
    assert report.ok, report.error
