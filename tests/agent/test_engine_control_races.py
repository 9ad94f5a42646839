"""Control-plane requests that reach an engine's supervisor at awkward moments (while its process is
being created), against real fake-engine processes (tests/agent/fake_engine.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.agent.test_engines import Env, spec
from tests.agent.ws_server import wait_for


@pytest.mark.asyncio
async def test_a_restart_that_comes_while_the_engine_is_being_created_restarts_it(tmp_path: Path) -> None:
    env = Env(tmp_path)
    try:
        await env.manager.apply([spec()])  # the supervisor is started, its process not created yet
        assert await env.manager.restart("d1") is True
        # The request is carried out, not kept for later: a second engine starts, counted once.
        await wait_for(lambda: env.manager.statuses()[0].restarts == 1 and env.states()[-1:] == ["running"])
        starts = Path(env.manager.log_path("d1")).read_text().count("agent: starting engine")
        assert starts == 2 and "failed" not in env.states()
        # So the engine's next crash is reported as one, not taken for that restart.
        sup = env.manager.supervisor("d1")
        assert sup is not None and sup.pid is not None
        os.kill(sup.pid, signal.SIGKILL)
        await wait_for(lambda: "failed" in env.states())
        failed = next(s for s in env.statuses if s.state == "failed")
        assert failed.error is not None and "exited with code" in failed.error
    finally:
        await env.manager.close()
