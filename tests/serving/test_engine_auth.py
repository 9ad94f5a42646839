"""serving.vllm_ext.engine_auth.EngineKeyGuard: an engine with a key answers only health and metrics
without it. vLLM's own check guards /v1 alone, leaving /invocations (which runs chat and completion
bodies) open to anyone who reaches the engine's port."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from serving.vllm_ext.engine_auth import EngineKeyGuard


def _call(guard: EngineKeyGuard, path: str, headers: list[tuple[bytes, bytes]], kind: str = "http") -> Any:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": kind, "path": path, "headers": headers, "method": "POST"}
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"] if sent and "status" in sent[0] else sent[0]["type"]


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> EngineKeyGuard:
    monkeypatch.setenv("VLLM_API_KEY", "the-key")
    return EngineKeyGuard(_app)


@pytest.mark.parametrize("path", ["/invocations", "/v1/completions", "/generative_scoring", "/tokenize", "/"])
def test_generation_and_every_other_path_need_the_key(guard: EngineKeyGuard, path: str) -> None:
    assert _call(guard, path, []) == 401
    assert _call(guard, path, [(b"authorization", b"Bearer not-the-key")]) == 401
    assert _call(guard, path, [(b"authorization", b"Basic the-key")]) == 401
    assert _call(guard, path, [(b"authorization", b"Bearer the-key")]) == 200


@pytest.mark.parametrize("path", ["/health", "/metrics", "/ping", "/version", "/health/"])
def test_health_and_metrics_are_open(guard: EngineKeyGuard, path: str) -> None:
    assert _call(guard, path, []) == 200


def test_a_websocket_without_the_key_is_closed(guard: EngineKeyGuard) -> None:
    assert _call(guard, "/v1/realtime", [], kind="websocket") == "websocket.close"


def test_without_a_key_everything_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert _call(EngineKeyGuard(_app), "/invocations", []) == 200
