"""A replay that ends while the agent's link is down keeps its answer and sends it right after the
next `register`: the profile job waiting for it (the agent was back within its grace) gets it, not
the probe's whole timeout (11 min by default) of waiting for an answer that was dropped."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection

from gpu_agent.agent import Agent
from gpu_agent.link import CLOSE_TRY_AGAIN
from gpu_agent.protocol import Probe, ProbeRequestSpec, dumps
from serving.backoff import Backoff
from tests.agent.test_agent_shutdown import ProbedHost, started
from tests.agent.ws_server import ControlPlaneStub, wait_for
from tests.planning import test_probe_runner as fake
from tests.planning.test_probe_runner import FakeEngine

engine = fake.engine  # the stand-in streaming engine (fixture)


@pytest.mark.asyncio
async def test_an_answer_of_a_replay_that_ended_while_disconnected_follows_the_next_register(
    engine: str, tmp_path: Path
) -> None:
    host = ProbedHost(engine, fake.spec(tmp_path))
    server, agent, run = await started(host)
    try:
        await wait_for(lambda: server.of_type("register"))
        requests = [ProbeRequestSpec(0.3 * k, 16, 4) for k in range(4)]  # about 1 s of replay
        await server.push(dumps(Probe("away", "7", 3.0, requests, timeout_s=60.0, seed=1)))
        await wait_for(lambda: len(FakeEngine.bodies) >= 1)
        await server.stop()  # the control plane goes away while the replay runs
        await wait_for(lambda: len(FakeEngine.bodies) == 4 and FakeEngine.in_flight == 0)
        await wait_for(lambda: not agent._probes)  # it ended, its answer not sent
        assert server.of_type("probe_result") == []
        registers = len(server.of_type("register"))

        await server.start()  # back, on the same port: the agent reconnects
        await wait_for(lambda: server.of_type("probe_result"))
        (report,) = server.of_type("probe_result")
        assert (report["probe_id"], report["ok"]) == ("away", True)
        kinds = [f["type"] for _, f in server.frames]
        # After the new connection's register, not before it (the control plane would refuse it).
        assert kinds.index("probe_result") > [i for i, k in enumerate(kinds) if k == "register"][registers]
        await asyncio.sleep(0.3)
        assert len(server.of_type("probe_result")) == 1  # sent once
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
        if server._server is not None:
            await server.stop()


class RefusingOnce(ControlPlaneStub):
    """A control plane whose next connection cannot store its `register` for a passing reason: it
    closes with 4503 and drops the frames after it (agents/consumers.py), as PROTOCOL.md says."""

    refuse_next = False

    async def _handler(self, ws: ServerConnection) -> None:
        if not self.refuse_next:
            await super()._handler(ws)
            return
        self.refuse_next = False
        self.frames.append((time.monotonic(), json.loads(await ws.recv())))  # the register
        await ws.close(CLOSE_TRY_AGAIN)  # what follows it is dropped unread


@pytest.mark.asyncio
async def test_an_answer_survives_a_register_the_control_plane_could_not_store(
    engine: str, tmp_path: Path
) -> None:
    host = ProbedHost(engine, fake.spec(tmp_path))
    server = RefusingOnce()
    await server.start()
    agent = Agent(host, server.url, "good-token", name="box", address="127.0.0.1", backoff=Backoff(0.05, 0.2))
    run = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: server.of_type("register"))
        await server.push(
            dumps(Probe("away", "7", 3.0, [ProbeRequestSpec(0.0, 16, 4)], timeout_s=60.0, seed=1))
        )
        await wait_for(lambda: len(FakeEngine.bodies) >= 1)
        await server.stop()
        await wait_for(lambda: not agent._probes)  # ended while disconnected: its answer kept
        assert server.of_type("probe_result") == []

        server.refuse_next = True  # the next register fails for a passing reason (4503) ...
        await server.start()
        await wait_for(lambda: len(server.of_type("register")) >= 3)  # ... the agent retries
        await wait_for(lambda: server.of_type("probe_result"))
        (report,) = server.of_type("probe_result")
        assert report["probe_id"] == "away"
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
        if server._server is not None:
            await server.stop()
