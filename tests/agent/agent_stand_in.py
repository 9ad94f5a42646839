"""A process that supervises one fake engine the way the agent does, for the orphan test.

    python agent_stand_in.py LOG_DIR PIDFILE [ENGINE_ARGS...]

Prints "running" once the engine answers /health, then waits to be killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from gpu_agent.engines import EngineManager, LaunchSpec
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, ModelSpec

FAKE_ENGINE = str(Path(__file__).with_name("fake_engine.py"))


async def main(log_dir: str, pidfile: str, *engine_args: str) -> None:
    def launch(spec: DeploymentSpec, port: int) -> LaunchSpec:
        env = {**os.environ, "FAKE_ENGINE_PIDFILE": pidfile}
        return LaunchSpec([sys.executable, FAKE_ENGINE, "--port", str(port), *engine_args], env)

    running = asyncio.Event()

    def on_status(status: DeploymentStatus) -> None:
        if status.state == "running":
            running.set()

    manager = EngineManager(launch, log_dir, on_status, devices={0})
    await manager.apply([DeploymentSpec("d1", ModelSpec("m", "/m"), [0])])
    await running.wait()
    print("running", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
