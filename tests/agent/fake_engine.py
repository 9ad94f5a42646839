"""A tiny stand-in engine process for supervision tests: serves /health and vLLM-style /metrics.

    python fake_engine.py --port P [--fail-at-start MSG] [--ignore-sigterm] [--start-delay S]
                          [--health-fail-file PATH] [--extra-metrics TEXT]

Every /metrics request adds observations (TTFT 0.05 s x2 and 0.3 s x1 per scrape; ITL 0.02 s x10),
so each scrape window is non-empty. While PATH (--health-fail-file) exists, the next /health is
answered 503 and PATH removed: a test fails one liveness probe by creating it. Writes its pid to
$FAKE_ENGINE_PIDFILE when set, and (like the Aqua connector) {"bytes_offloaded": 4096 * scrapes}
to $AQUA_STATS_DIR/offload-worker.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TTFT_BOUNDS = ["0.01", "0.1", "0.5", "1.0", "+Inf"]
ITL_BOUNDS = ["0.01", "0.025", "0.05", "+Inf"]


class State:
    scrapes = 0
    extra_metrics = ""  # appended to every /metrics answer
    health_fail_file: str | None = None
    lock = threading.Lock()


def metrics_text(n: int) -> str:
    # n scrapes so far: TTFT has 2n observations at 0.05 s and n at 0.3 s; ITL 10n at 0.02 s.
    ttft = {"0.01": 0, "0.1": 2 * n, "0.5": 3 * n, "1.0": 3 * n, "+Inf": 3 * n}
    itl = {"0.01": 0, "0.025": 10 * n, "0.05": 10 * n, "+Inf": 10 * n}
    lines = [
        "# HELP vllm:time_to_first_token_seconds TTFT.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    lines += [
        f'vllm:time_to_first_token_seconds_bucket{{le="{b}",model_name="fake"}} {ttft[b]}'
        for b in TTFT_BOUNDS
    ]
    lines += [f'vllm:time_to_first_token_seconds_count{{model_name="fake"}} {3 * n}']
    lines += [f'vllm:time_to_first_token_seconds_sum{{model_name="fake"}} {0.4 * n}']
    lines += [
        "# HELP vllm:inter_token_latency_seconds ITL.",
        "# TYPE vllm:inter_token_latency_seconds histogram",
    ]
    lines += [
        f'vllm:inter_token_latency_seconds_bucket{{le="{b}",model_name="fake"}} {itl[b]}' for b in ITL_BOUNDS
    ]
    lines += [f'vllm:inter_token_latency_seconds_count{{model_name="fake"}} {10 * n}']
    lines += [f'vllm:inter_token_latency_seconds_sum{{model_name="fake"}} {0.2 * n}']
    lines += ["# HELP vllm:kv_cache_usage_perc KV.", "# TYPE vllm:kv_cache_usage_perc gauge"]
    lines += ['vllm:kv_cache_usage_perc{model_name="fake"} 0.25']
    lines += ["# HELP vllm:num_requests_running R.", "# TYPE vllm:num_requests_running gauge"]
    lines += ['vllm:num_requests_running{model_name="fake"} 3']
    lines += ["# HELP vllm:num_requests_waiting W.", "# TYPE vllm:num_requests_waiting gauge"]
    lines += ['vllm:num_requests_waiting{model_name="fake"} 2']
    lines += ["# HELP vllm:num_preemptions_total P.", "# TYPE vllm:num_preemptions_total counter"]
    lines += [f'vllm:num_preemptions_total{{model_name="fake"}} {n}']
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            if State.health_fail_file is not None and os.path.exists(State.health_fail_file):
                os.unlink(State.health_fail_file)
                self.send_error(503)
                return
            body = b""
        elif self.path == "/metrics":
            with State.lock:
                State.scrapes += 1
                body = (metrics_text(State.scrapes) + State.extra_metrics).encode()
                stats_dir = os.environ.get("AQUA_STATS_DIR")
                if stats_dir:  # like serving.vllm_ext's offload worker: counters as JSON
                    os.makedirs(stats_dir, exist_ok=True)
                    tmp = os.path.join(stats_dir, ".offload-worker.json.tmp")
                    with open(tmp, "w") as f:
                        json.dump({"bytes_offloaded": 4096 * State.scrapes}, f)
                    os.replace(tmp, os.path.join(stats_dir, "offload-worker.json"))
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def aqua(lease: int | None, allocate: int | None) -> list[object]:
    """Use the agent's coordinator the way an engine would, from the env the agent sets."""
    if lease is None and allocate is None:
        return []
    from serving.aqua.coordinator import AquaClient

    client = AquaClient(os.environ["AQUA_COORDINATOR_SOCKET"], name=os.environ["AQUA_ENGINE_ID"])
    engine_id, device = os.environ["AQUA_ENGINE_ID"], f"cuda:{os.environ['AQUA_DEVICE']}"
    if lease is not None:
        client.lease(engine_id, device, lease, {"kind": "fake"})
    if allocate is not None:
        # The producer may still be starting: retry for a few seconds.
        for _ in range(100):
            if client.allocate(engine_id, allocate) is not None:
                break
            time.sleep(0.05)
    return [client]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fail-at-start")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--start-delay", type=float, default=0.0)
    p.add_argument("--health-fail-file", help="answer /health 503 once each time this file appears")
    p.add_argument("--aqua-lease", type=int, help="lease this many bytes as a producer")
    p.add_argument("--aqua-allocate", type=int, help="allocate this many bytes as a consumer")
    p.add_argument("--extra-metrics", default="", help="text appended to every /metrics answer")
    args = p.parse_args()
    State.health_fail_file = args.health_fail_file
    State.extra_metrics = args.extra_metrics
    clients = aqua(args.aqua_lease, args.aqua_allocate)  # kept open: the session owns the memory
    if os.environ.get("FAKE_ENGINE_PIDFILE"):
        with open(os.environ["FAKE_ENGINE_PIDFILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
    print(f"fake engine starting on port {args.port}", flush=True)
    if args.fail_at_start:
        print("Traceback (most recent call last):", file=sys.stderr)
        print(f"ValueError: {args.fail_at_start}", file=sys.stderr, flush=True)
        sys.exit(3)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    time.sleep(args.start_delay)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print("fake engine ready", flush=True)
    server.serve_forever()
    del clients


if __name__ == "__main__":
    main()
