"""The agent's probe runner replays a workload over real HTTP against an OpenAI-style streaming
server and measures TTFT, time between tokens and KV use. The server here is a stand-in engine with
known delays (the real vLLM engine is exercised in test_engine_profiling.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpu_agent.probe import ProbeRunner, kv_bytes_per_token
from gpu_agent.protocol import DeploymentSpec, ModelSpec, Probe, ProbeRequestSpec

TTFT_S, TBT_S = 0.05, 0.02
BLOCKS, BLOCK_SIZE = 100, 16
CONFIG = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "vocab_size": 1000,
    "torch_dtype": "float32",
}


class FakeEngine(BaseHTTPRequestHandler):
    """Streams one chunk per token: the first after TTFT_S, then one every TBT_S. A prompt of 13
    tokens gets HTTP 500. KV usage = `usage_per_request` per request in flight."""

    protocol_version = "HTTP/1.0"
    bodies: list[dict[str, Any]] = []
    authorizations: list[str | None] = []  # each POST's Authorization header
    in_flight = 0
    usage_per_request = 0.1
    lock = threading.Lock()

    def do_GET(self) -> None:
        usage = min(1.0, FakeEngine.usage_per_request * FakeEngine.in_flight)
        text = (
            f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",engine="0",num_gpu_blocks="{BLOCKS}"}} 1.0\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}\n'
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(text.encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with FakeEngine.lock:
            FakeEngine.bodies.append(body)
            FakeEngine.authorizations.append(self.headers.get("Authorization"))
        if len(body["prompt"]) == 13:
            self.send_response(500)
            self.end_headers()
            return
        with FakeEngine.lock:
            FakeEngine.in_flight += 1
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            time.sleep(TTFT_S)
            n = body["max_tokens"]
            for i in range(n):
                chunk = {
                    "choices": [{"index": 0, "text": "x", "finish_reason": "length" if i == n - 1 else None}]
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                if i < n - 1:
                    time.sleep(TBT_S)
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            with FakeEngine.lock:
                FakeEngine.in_flight -= 1

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    FakeEngine.bodies = []
    FakeEngine.authorizations = []
    FakeEngine.usage_per_request = 0.1
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def spec(tmp_path: Path) -> DeploymentSpec:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return DeploymentSpec("7", ModelSpec("m", str(tmp_path), dtype="auto"), [0])


def probe(*requests: tuple[float, int, int]) -> Probe:
    return Probe("p", "7", 4.0, [ProbeRequestSpec(*r) for r in requests], timeout_s=30.0, seed=1)


def test_it_measures_latencies_and_kv_use_of_a_streaming_engine(engine: str, tmp_path: Path) -> None:
    frame = probe((0.0, 20, 5), (0.6, 30, 5), (0.65, 40, 5), (0.7, 8, 3))  # the first runs alone
    report = asyncio.run(ProbeRunner(engine, spec(tmp_path), sample_interval_s=0.02).run(frame))
    assert report.ok and (report.probe_id, report.deployment_id, report.rate) == ("p", "7", 4.0)
    assert (report.num_requests, report.finished) == (4, 4)
    assert report.ttft_p50_s is not None and TTFT_S <= report.ttft_p50_s < 10 * TTFT_S
    # (the client reads chunks late under load, which shortens the gap after: loose lower bounds)
    assert report.tbt_p50_s is not None and TBT_S * 0.5 <= report.tbt_p50_s < 10 * TBT_S
    assert report.ttft_p99_s is not None and report.tbt_p99_s is not None
    bpt = 2 * 2 * 2 * 64 * 4  # K and V x layers x KV heads x head dim x float32
    assert report.kv_bytes_per_token == bpt == kv_bytes_per_token(CONFIG, "auto")
    assert report.kv_capacity_bytes == BLOCKS * BLOCK_SIZE * bpt
    assert 0 < report.peak_kv_used_bytes <= report.peak_kv_demand_bytes
    assert report.duration_s >= 0.7 + TTFT_S
    # every request asked for exactly its output length, EOS ignored, with a prompt of exactly its
    # length drawn from the vocabulary (past the first ids, where special tokens live)
    sent = sorted(FakeEngine.bodies, key=lambda b: len(b["prompt"]))
    assert [(len(b["prompt"]), b["max_tokens"]) for b in sent] == [(8, 3), (20, 5), (30, 5), (40, 5)]
    assert all(b["ignore_eos"] and b["stream"] and b["model"] == "m" for b in sent)
    assert all(10 <= t < CONFIG["vocab_size"] for b in sent for t in b["prompt"])
    # cost-model samples: the first request ran alone until its first token (prefill of 20 tokens);
    # decode gaps are about TBT_S with the contexts of the requests running then. The engine spaces
    # chunks by at least TBT_S, but one chunk read late makes the next gap short: a single gap is
    # only bounded loosely, and their median by half of TBT_S.
    prefill = [(s.lens, s.seconds) for s in report.prefill_samples]
    assert prefill and prefill[0][0] == [20] and TTFT_S <= prefill[0][1] < 10 * TTFT_S
    assert all(lens in ([20], [30], [40], [8]) for lens, _ in prefill)
    assert report.decode_samples
    for sample in report.decode_samples:
        assert 1 <= len(sample.lens) <= 4 and 0 < sample.seconds < 10 * TBT_S
        assert all(8 < n <= 45 for n in sample.lens)  # prompt + tokens so far, before the last
    assert statistics.median(s.seconds for s in report.decode_samples) >= TBT_S * 0.5


def test_kv_held_by_the_streams_counts_when_every_scrape_misses_it(engine: str, tmp_path: Path) -> None:
    # The gauge never shows the requests (as when a fast engine finishes them between two scrapes);
    # the two overlapping streams still prove that their prompts and streamed tokens were held at once.
    FakeEngine.usage_per_request = 0.0
    frame = probe((0.0, 40, 6), (0.01, 30, 6))
    report = asyncio.run(ProbeRunner(engine, spec(tmp_path), sample_interval_s=60.0).run(frame))
    assert report.ok and report.finished == 2
    bpt = report.kv_bytes_per_token
    assert (40 + 30) * bpt <= report.peak_kv_used_bytes <= (40 + 30 + 2 * 6) * bpt
    assert report.peak_kv_used_bytes <= report.peak_kv_demand_bytes


def test_it_counts_a_failed_request_as_infinitely_late(engine: str, tmp_path: Path) -> None:
    report = asyncio.run(
        ProbeRunner(engine, spec(tmp_path)).run(probe((0.0, 20, 2), (0.0, 13, 2), (0.0, 9, 2)))
    )
    assert report.ok and (report.num_requests, report.finished) == (3, 2)
    assert report.ttft_p99_s is None  # 1 of 3 requests produced no token: the P99 is unbounded
    assert report.ttft_p50_s is not None


def test_it_reports_no_capacity_when_the_model_config_is_unreadable(engine: str) -> None:
    remote = DeploymentSpec("7", ModelSpec("m", "org/remote-model"), [0])
    report = asyncio.run(ProbeRunner(engine, remote).run(probe((0.0, 5, 2))))
    assert report.ok and report.finished == 1
    assert (report.kv_bytes_per_token, report.kv_capacity_bytes, report.peak_kv_used_bytes) == (0, 0, 0)


def test_a_probe_fails_when_the_engine_is_unreachable(tmp_path: Path) -> None:
    # An engine restarting mid-probe refuses connections. Counted as late answers, they would pull
    # the profile's max rate far below the engine's; the probe fails, naming why, instead.
    gone = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    report = asyncio.run(ProbeRunner(gone, spec(tmp_path)).run(probe((0.0, 20, 2), (0.1, 20, 2))))
    assert not report.ok
    assert "the engine was unreachable during the probe: 2 of 2 requests" in (report.error or "")
    assert "ConnectError" in (report.error or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_it_sends_the_engines_key_with_every_request(engine: str, tmp_path: Path) -> None:
    """The engine runs with its deployment's key (vLLM's VLLM_API_KEY) and refuses requests
    without it: a probe that did not send it would measure nothing but 401s."""
    keyed = dataclasses.replace(spec(tmp_path), api_key="k" * 64)
    report = asyncio.run(
        ProbeRunner(engine, keyed, sample_interval_s=0.02).run(probe((0.0, 8, 2), (0.1, 9, 2)))
    )
    assert report.ok and report.finished == 2
    assert FakeEngine.authorizations == ["Bearer " + "k" * 64] * 2
