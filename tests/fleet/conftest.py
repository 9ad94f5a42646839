"""Fixtures for fleet tests: a host with an agent token, a model, frames, API clients."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from accounts.models import Role, User
from accounts.services import issue_api_token
from inventory.models import Host
from inventory.services import issue_agent_token, register_host
from registry.models import ServedModel
from rest_framework.test import APIClient

if TYPE_CHECKING:
    from channels.testing import WebsocketCommunicator


@dataclass
class AgentHost:
    host: Host
    token: str


@pytest.fixture
def agent_host(transactional_db: None) -> AgentHost:
    host = register_host("gpu-a", "10.0.0.5")
    return AgentHost(host, issue_agent_token(host).plaintext)


def agent_socket(agent_host: AgentHost, path: str = "/ws/agent/") -> WebsocketCommunicator:
    """A websocket to the control plane's agent endpoint at `path`, with the host's agent token."""
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    headers = [(b"authorization", f"Bearer {agent_host.token}".encode())]
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.fixture
def served_model(transactional_db: None) -> ServedModel:
    return ServedModel.objects.create(
        name="tiny",
        source="/models/tiny",
        dtype="float32",
        tensor_parallel_size=1,
        max_context_length=256,
        slo_ttft_p99_ms=500.0,
        slo_tbt_p99_ms=50.0,
        engine_options={"seed": 0},
    )


def register_frame(host: str = "gpu-a", gpus: int = 2, address: str = "10.0.0.5") -> dict[str, Any]:
    return {
        "v": 1,
        "type": "register",
        "host": host,
        "address": address,
        "agent_version": "0.1.0",
        "simulated": False,
        "devices": [
            {
                "index": i,
                "uuid": f"GPU-{host}-{i}",
                "name": "NVIDIA H100",
                "kind": "gpu",
                "memory_total_bytes": 80 << 30,
                "nvlink_peers": [j for j in range(gpus) if j != i],
            }
            for i in range(gpus)
        ],
    }


def device_sample(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "memory_used_bytes": (10 + index) << 30,
        "memory_free_bytes": (70 - index) << 30,
        "utilization_pct": 50.0 + index,
        "temperature_c": 60.0,
        "power_w": 300.0,
        **extra,
    }


def telemetry_frame(
    devices: list[dict[str, Any]], engines: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"v": 1, "type": "telemetry", "ts": time.time(), "devices": devices, "engines": engines or []}


def _client(role: Role, name: str) -> APIClient:
    user = User.objects.create_user(username=name, password=f"{name}-pw-9f2k", role=role)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user, 'test').plaintext}")
    return client


@pytest.fixture
def viewer_client(db: None) -> APIClient:
    return _client(Role.VIEWER, "bob")


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()
