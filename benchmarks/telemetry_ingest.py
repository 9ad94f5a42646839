"""Telemetry ingest: device samples the control plane receives over agent websockets AND stores, per second.

Set-up: a fresh database (SQLite in a temporary directory unless --database-url names a scratch
PostgreSQL database), migrated; the real ASGI server (daphne, config.asgi) in a subprocess;
`--clients` fake agents (default 8), each a real websocket client with its own host token that
registers 8 GPUs and then sends realistic `telemetry` frames (8 device samples with Aqua fields and
2 engine samples each) as fast as the server stores them. Each client keeps at most `--backlog`
frames in flight (sent but not yet stored, read from the database), so the figure is the sustained
rate, not the size of a queue. Target: `samples_per_second` >= 2000.

Baseline, measured in the same run: the same frames stored row by row (one INSERT and one commit
per device sample, no websocket), the naive way, in this process against the same database.

Usage: python benchmarks/telemetry_ingest.py [--quick] [--out PATH] [--clients N] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET = 2000.0

from benchmarks.bench_io import open_files_count, out_file, positive_int  # noqa: E402
from serving.atomic_file import write_json_atomic  # noqa: E402

DEVICES = 8
ENGINES = 2


class MigrateFailed(Exception):
    """`manage.py migrate` failed on the benchmark's database; the message is its last line."""


def database_url(text: str) -> str:
    """argparse type of --database-url: a URL the settings take (config.settings' DATABASE_URL)."""
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme not in ("postgres", "postgresql", "pgsql", "sqlite"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a postgres:// (or sqlite://) URL")
    return text


def setup_django(var_dir: Path, database_url: str | None) -> None:
    os.environ["VAR_DIR"] = str(var_dir)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["LOG_LEVEL"] = "WARNING"
    for path in (str(ROOT), str(ROOT / "platform")):
        if path not in sys.path:
            sys.path.insert(0, path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)])}
    migrate = [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"]
    done = subprocess.run(migrate, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # its traceback stays inside; its last unindented line says why
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line[0].isspace()]
        raise MigrateFailed(lines[-1] if lines else f"exit status {done.returncode}")
    import django

    django.setup()


def make_hosts(clients: int) -> list[tuple[str, str, list[int]]]:
    """Hosts with a token and 2 running deployments each: (name, token, deployment ids)."""
    from deployments.models import Deployment
    from inventory.models import Device
    from inventory.services import issue_agent_token, register_host
    from registry.models import ServedModel

    model = ServedModel.objects.create(
        name="bench", source="/models/bench", max_context_length=4096, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    out = []
    for i in range(clients):
        host = register_host(f"bench-{i}", "127.0.0.1")
        deployments = []
        for g in range(ENGINES):
            device = Device.objects.create(
                host=host, index=g, uuid=f"GPU-bench-{i}-{g}", name="H100", memory_total_bytes=80 << 30
            )
            deployment = Deployment.objects.create(model=model, host=host)
            deployment.devices.set([device])
            deployments.append(deployment.pk)
        out.append((host.name, issue_agent_token(host).plaintext, deployments))
    return out


def register_frame(name: str) -> dict[str, Any]:
    devices = [
        {
            "index": g,
            "uuid": f"GPU-bench-{name}-{g}",
            "name": "H100",
            "kind": "gpu",
            "memory_total_bytes": 80 << 30,
            "nvlink_peers": [p for p in range(DEVICES) if p != g],
        }
        for g in range(DEVICES)
    ]
    return {"v": 1, "type": "register", "host": name, "address": "127.0.0.1", "agent_version": "bench",
            "simulated": True, "devices": devices}  # fmt: skip


def telemetry_frame(rng: random.Random, deployments: list[int]) -> str:
    devices = []
    for g in range(DEVICES):
        used = rng.randrange(10 << 30, 70 << 30)
        role = "producer" if g % 2 else "consumer"
        devices.append(
            {
                "index": g,
                "memory_used_bytes": used,
                "memory_free_bytes": (80 << 30) - used,
                "utilization_pct": round(rng.uniform(0, 100), 1),
                "temperature_c": round(rng.uniform(40, 80), 1),
                "power_w": round(rng.uniform(100, 700), 1),
                "aqua_role": role,
                "lent_bytes": rng.randrange(0, 16 << 30) if role == "producer" else 0,
                "borrowed_bytes": rng.randrange(0, 16 << 30) if role == "consumer" else 0,
                "paired_with": g - 1 if g % 2 else g + 1,
            }
        )
    engines = [
        {
            "deployment_id": str(d),
            "state": "running",
            "ttft": {"count": 5, "p50": rng.uniform(0.05, 0.2), "p99": rng.uniform(0.2, 0.9)},
            "itl": {"count": 120, "p50": rng.uniform(0.01, 0.03), "p99": rng.uniform(0.03, 0.1)},
            "kv_cache_usage": rng.uniform(0, 1),
            "running": rng.randrange(0, 64),
            "waiting": rng.randrange(0, 16),
            "preemptions_total": rng.randrange(0, 1000),
            "bytes_offloaded": rng.randrange(0, 1 << 40),
        }
        for d in deployments
    ]
    body = json.dumps({"devices": devices, "engines": engines})
    return '{"v": 1, "type": "telemetry", "ts": %TS%, ' + body[1:]


def stamp(template: str) -> str:
    """A pre-built frame with the current time (clients must not eat the server's CPU)."""
    return template.replace("%TS%", repr(time.time()), 1)


def stored_rows() -> int:
    """Device samples stored so far (ids grow by one per row; MAX(id) is an index lookup)."""
    from agents.models import DeviceSample
    from django.db.models import Max

    return int(DeviceSample.objects.aggregate(m=Max("id"))["m"] or 0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_clients(url: str, hosts: list[tuple[str, str, list[int]]], warmup_s: float, measure_s: float,
                      backlog: int, server_pid: int) -> dict[str, float]:  # fmt: skip
    from channels.db import database_sync_to_async
    from websockets.asyncio.client import connect

    sent = [0]
    stored = [await database_sync_to_async(stored_rows)()]
    initial = stored[0]
    stop = asyncio.Event()

    async def client(i: int, name: str, token: str, deployments: list[int]) -> None:
        rng = random.Random(i)
        templates = [telemetry_frame(rng, deployments) for _ in range(64)]
        ws_url = url.replace("http://", "ws://") + "/ws/agent/"
        async with connect(
            ws_url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=2**22
        ) as ws:
            await ws.send(json.dumps(register_frame(name)))
            await ws.recv()  # desired_deployments: registered
            reader = asyncio.create_task(_drain(ws))
            per_client = max(1, backlog)
            while not stop.is_set():
                # Closed loop: at most `backlog` frames per client in flight (sent, not yet stored).
                if (sent[0] * DEVICES - (stored[0] - initial)) // DEVICES >= per_client * len(hosts):
                    await asyncio.sleep(0.005)
                    continue
                await ws.send(stamp(templates[sent[0] % len(templates)]))
                sent[0] += 1
            reader.cancel()

    async def monitor() -> None:
        while not stop.is_set():
            stored[0] = await database_sync_to_async(stored_rows)()
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(client(i, *h)) for i, h in enumerate(hosts)]
    mon = asyncio.create_task(monitor())
    await asyncio.sleep(warmup_s)
    start_rows, start, cpu0 = (
        await database_sync_to_async(stored_rows)(),
        time.perf_counter(),
        cpu_seconds(server_pid),
    )
    await asyncio.sleep(measure_s)
    end_rows, end, cpu1 = (
        await database_sync_to_async(stored_rows)(),
        time.perf_counter(),
        cpu_seconds(server_pid),
    )
    stop.set()
    await asyncio.gather(*tasks, mon, return_exceptions=True)
    rate = (end_rows - start_rows) / (end - start)
    return {
        "samples_per_second": rate,
        "frames_per_second": rate / DEVICES,
        "measured_s": end - start,
        "server_cpu_s": cpu1 - cpu0,
        "samples_per_server_cpu_second": (end_rows - start_rows) / max(cpu1 - cpu0, 1e-9),
    }


async def _drain(ws: Any) -> None:
    async for _ in ws:  # desired lists and error frames; an error here would show in the server log
        pass


def baseline_row_by_row(hosts: list[tuple[str, str, list[int]]], seconds: float) -> float:
    """Device samples per second stored one INSERT + commit at a time (no websocket, no parsing)."""
    from agents.models import DeviceSample
    from inventory.models import Device

    rng = random.Random(99)
    device_ids = list(
        Device.objects.filter(host__name=hosts[0][0]).order_by("index").values_list("pk", flat=True)
    )
    stored, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        frame = json.loads(stamp(telemetry_frame(rng, [])))
        for sample, device_id in zip(frame["devices"], device_ids, strict=True):
            fields = {k: v for k, v in sample.items() if k != "index"}
            DeviceSample.objects.create(device_id=device_id, ts=_now(), **fields)
            stored += 1
    return stored / (time.perf_counter() - start)


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def start_server(port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)])}
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health/", timeout=2):
                return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("daphne did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run (5 s measured)")
    parser.add_argument("--out", type=out_file, help="write the JSON result here")
    parser.add_argument(
        "--clients",
        type=open_files_count("clients", 1),  # the server's websocket of each
        default=8,
        help="concurrent fake agents (8 devices each)",
    )
    parser.add_argument("--backlog", type=positive_int, default=16, help="frames in flight per client")
    parser.add_argument(
        "--database-url",
        type=database_url,
        help="a scratch PostgreSQL database (default: SQLite in a temp dir)",
    )
    args = parser.parse_args()
    warmup_s, measure_s, baseline_s = (2.0, 5.0, 2.0) if args.quick else (5.0, 30.0, 10.0)

    with tempfile.TemporaryDirectory(prefix="telemetry-ingest-") as tmp:
        try:
            setup_django(Path(tmp), args.database_url)
        except MigrateFailed as error:
            where = f"--database-url {args.database_url!r}" if args.database_url else "a temporary SQLite"
            parser.error(f"cannot migrate the database ({where}): {error}")
        from django.db import connection

        hosts = make_hosts(args.clients)
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = start_server(port)
        try:
            load = os.getloadavg()[0]
            result = asyncio.run(
                run_clients(f"http://127.0.0.1:{port}", hosts, warmup_s, measure_s, args.backlog, server.pid)
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
        baseline = baseline_row_by_row(hosts, baseline_s)
        vendor = connection.vendor

    rate = result["samples_per_second"]
    out = {
        "benchmark": "telemetry_ingest",
        "samples_per_second": round(rate, 1),
        "target_samples_per_second": TARGET,
        "meets_target": rate >= TARGET,
        "ratio_to_target": round(rate / TARGET, 2),
        "frames_per_second": round(result["frames_per_second"], 1),
        "baseline_row_by_row_samples_per_second": round(baseline, 1),
        "ratio_to_row_by_row": round(rate / baseline, 2),
        "clients": args.clients,
        "devices_per_frame": DEVICES,
        "engines_per_frame": ENGINES,
        "backlog_frames_per_client": args.backlog,
        "measured_s": round(result["measured_s"], 2),
        # The server's own CPU time over the measured window: the rate per CPU-second it used is
        # what one dedicated core would sustain; on a shared machine the wall rate is lower.
        "server_cpu_s": round(result["server_cpu_s"], 2),
        "samples_per_server_cpu_second": round(result["samples_per_server_cpu_second"], 1),
        "load_average_1m_at_start": round(load, 2),
        "database": vendor,
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(
        f"stored {rate:,.0f} device samples/s ({result['frames_per_second']:,.0f} frames/s) over websockets "
        f"on {vendor}; target {TARGET:,.0f} (x{rate / TARGET:.2f}); row-by-row baseline {baseline:,.0f}/s "
        f"(x{rate / baseline:.2f}); server used {result['server_cpu_s']:.1f} CPU-s in "
        f"{result['measured_s']:.1f} s: {result['samples_per_server_cpu_second']:,.0f} samples per server "
        f"CPU-second; 1-min load average at start {load:.1f} on {os.cpu_count()} CPUs"
    )
    if args.out:
        write_json_atomic(args.out, out)


if __name__ == "__main__":
    main()
