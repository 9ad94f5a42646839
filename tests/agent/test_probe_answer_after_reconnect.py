"""A replay that ends while the agent's link is down keeps its answer and sends it right after the
next `register`: the profile job waiting for it (the agent was back within its grace) gets it, not
the probe's whole timeout (11 min by default) of waiting for an answer that was dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpu_agent.protocol import Probe, ProbeRequestSpec, dumps
from tests.agent.test_agent_shutdown import ProbedHost, started
from tests.agent.ws_server import wait_for
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
