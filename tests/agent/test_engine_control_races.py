"""Control-plane requests that reach an engine's supervisor at awkward moments (while its process is
being created), against real fake-engine processes (tests/agent/fake_engine.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_engines import Env, alive, spec
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


@pytest.mark.asyncio
async def test_a_stop_that_comes_while_the_engine_is_being_created_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two engines start together (d2 never answers /health); the agent stops while d1's process is
    # being created, and the loop (a loaded host's) resumes d1's supervisor only once d1 serves.
    # stop() found no process to end then, and the supervisor took d1, answering its first /health,
    # for running and watched it until it exited on its own: close() hung as long as it ran.
    created, closing, spawned = asyncio.Event(), asyncio.Event(), []
    spawn = asyncio.create_subprocess_exec

    async def slow_spawn(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await spawn(*argv, **kwargs)
        spawned.append(proc.pid)
        if "--start-delay" not in argv:  # d1
            created.set()
            await closing.wait()
            await asyncio.sleep(0.1)  # close() has begun stopping the engines
            port, deadline = int(argv[argv.index("--port") + 1]), time.monotonic() + 10
            while not serves(port) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_spawn)
    env = Env(tmp_path)
    try:
        await env.manager.apply([spec("d1", [0]), spec("d2", [1], fake_args=["--start-delay", "60"])])
        await asyncio.wait_for(created.wait(), 10)
        closing.set()
        await asyncio.wait_for(env.manager.close(), 10)
        assert env.states("d1") == ["starting", "stopped"]
        assert len(spawned) == 2 and not any(alive(p) for p in spawned)
    finally:
        for pid in [p for p in spawned if alive(p)]:  # (left running when close() hangs)
            os.kill(pid, signal.SIGKILL)


def serves(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
