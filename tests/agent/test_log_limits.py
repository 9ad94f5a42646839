"""Engine logs are bounded: on disk (rotated at each engine start) and on the wire (a `log_tail`
or a failed status never comes near the 1 MiB at which the control plane drops a message)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_agent.engines import EngineSupervisor
from gpu_agent.engines.logs import cap_lines, tail_lines
from gpu_agent.protocol import Command, DeploymentStatus, dumps
from serving.backoff import Backoff
from tests.agent.test_engines import fake_launcher, spec
from tests.agent.test_link_robustness import make_agent, running_agent, server  # noqa: F401
from tests.agent.ws_server import ControlPlaneStub, wait_for

CUT = "more characters cut by the agent]"


@pytest.mark.asyncio
async def test_a_log_tail_of_long_lines_stays_far_below_a_megabyte(
    tmp_path: Path,
    server: ControlPlaneStub,  # noqa: F811
) -> None:
    log = tmp_path / "logs" / "d1.log"
    log.parent.mkdir()
    # 6 MB of progress-bar-like lines: sent as is, the frame would be dropped by the server.
    log.write_text("".join(f"{i} " + "#" * 20000 + "\n" for i in range(300)) + "last line\n")
    async with running_agent(make_agent(tmp_path, server)) as agent:
        await wait_for(lambda: agent.link.connected)
        await server.push(dumps(Command("c1", "tail_log", "d1", lines=1000)))
        await wait_for(lambda: len(server.of_type("log_tail")) == 1)
        assert agent.link.stats.connects == 1
    tail = server.of_type("log_tail")[0]
    assert len(json.dumps(tail)) <= 256 * 1024
    lines = tail["lines"]
    assert lines[-1] == "last line"
    assert lines[-2].startswith("299 ###") and lines[-2].endswith(CUT)
    assert lines[0].startswith("[... ") and "earlier line(s) left out" in lines[0]


def test_it_caps_lines_by_their_encoded_size() -> None:
    # Control characters take six bytes each in JSON: the cap counts what is sent.
    lines = ["\x01" * 3000 for _ in range(40)] + ["é" * 10, "newest"]
    capped = cap_lines(lines, 50_000)
    assert len(json.dumps(capped)) <= 50_000
    assert capped[-2:] == ["é" * 10, "newest"] and len(capped) < len(lines)
    assert cap_lines(["a", "b"], 50_000) == ["a", "b"]  # nothing cut, no note


def test_a_tail_reads_a_bounded_amount_of_a_log_without_newlines(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"x" * (3 * 2**20) + b"END")
    (line,) = tail_lines(str(path), 5, max_read=2**20)
    assert len(line) == 2**20 and line.endswith("END")


@pytest.mark.asyncio
async def test_a_failed_status_carries_a_bounded_log_tail(tmp_path: Path) -> None:
    statuses: list[DeploymentStatus] = []
    sup = EngineSupervisor(
        spec(fake_args=["--fail-at-start", "CUDA error " + "x" * 100_000]),
        fake_launcher(tmp_path / "pids"),
        str(tmp_path / "d1.log"),
        statuses.append,
        backoff=Backoff(base_s=5, cap_s=5),
    )
    sup.start()
    try:
        await wait_for(lambda: any(s.state == "failed" for s in statuses))
    finally:
        await sup.stop()
    error = next(s.error for s in statuses if s.state == "failed")
    assert error is not None and len(error.encode()) <= 20 * 1024
    assert "ValueError: CUDA error xxx" in error and CUT in error


@pytest.mark.asyncio
async def test_it_rotates_the_engine_log_at_each_start_keeping_two_old_files(tmp_path: Path) -> None:
    statuses: list[DeploymentStatus] = []
    log = tmp_path / "d1.log"
    sup = EngineSupervisor(
        spec(fake_args=["--fail-at-start", "boom"]),  # a crash loop
        fake_launcher(tmp_path / "pids"),
        str(log),
        statuses.append,
        backoff=Backoff(base_s=0.05, cap_s=0.1),
        log_max_bytes=100,  # every run's output is more than this
        log_backups=2,
    )
    sup.start()
    try:
        await wait_for(lambda: sum(s.state == "failed" for s in statuses) >= 5)
    finally:
        await sup.stop()
    assert sorted(p.name for p in tmp_path.glob("d1.log*")) == ["d1.log", "d1.log.1", "d1.log.2"]
    assert log.read_text().count("agent: starting engine") == 1  # the last run, perhaps cut short
    for old in ("d1.log.1", "d1.log.2"):
        text = (tmp_path / old).read_text()
        assert text.count("agent: starting engine") == 1 and "ValueError: boom" in text
