"""`make run` end to end: scripts/run_local.py on the embedded default, then Ctrl-C.

Starts the real supervisor (migrate, first admin, daphne, Celery worker on the filesystem broker)
in a fresh VAR_DIR, signs in with the printed password, runs a noop job to completion through the
API, sends SIGINT and checks that no process it started is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _call(method: str, url: str, body: dict[str, Any] | None = None, token: str = "") -> Any:
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Token {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().split(") ", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_it_serves_the_api_with_a_live_worker_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    port = _free_port()
    drop = (
        "PYTEST_VERSION",
        "DATABASE_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
        "DJANGO_DB_NAME",
        "CELERY_QUEUE",
        "CELERY_BROKER_DIR",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # No vLLM engine here (minutes on 2 cores; tests/fleet covers it), but a simulated host, so the
    # agent path of `make run` is exercised too.
    env.update(
        {
            "VAR_DIR": str(tmp_path / "var"),
            "PORT": str(port),
            "CELERY_CONCURRENCY": "1",
            "LOCAL_AGENT": "0",
            "SIMULATE": "2xH100",
        }
    )
    process = subprocess.Popen(
        [sys.executable, "scripts/run_local.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("[run] ready"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(180), "".join(lines)
        output = "".join(lines)
        password = re.search(r"with password: (\S+)", output)
        assert password, output
        children = [int(pid) for pid in re.findall(r"\[run\] started \w+ \(pid (\d+)\)", output)]
        assert len(children) == 3  # web, worker, simulated agent

        base = f"http://127.0.0.1:{port}"
        assert _call("GET", f"{base}/api/health/")["status"] == "ok"
        token = _call("POST", f"{base}/api/v1/auth/token/", {"username": "admin", "password": password[1]})[
            "token"
        ]
        job = _call(
            "POST", f"{base}/api/v1/jobs/", {"kind": "noop", "params": {"steps": 3, "delay_s": 0.1}}, token
        )
        deadline = time.monotonic() + 60
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            job = _call("GET", f"{base}/api/v1/jobs/{job['id']}/", token=token)
        assert job["status"] == "succeeded", (job, "".join(lines))
        assert job["result"] == {"steps_done": 3}
        docs_request = urllib.request.Request(
            f"{base}/api/docs/", headers={"Authorization": f"Token {token}"}
        )
        with urllib.request.urlopen(docs_request, timeout=10) as docs:
            assert b"swagger-ui" in docs.read()
        hosts: list[dict[str, Any]] = []
        while time.monotonic() < deadline + 60:
            hosts = _call("GET", f"{base}/api/v1/hosts/", token=token)
            hosts = hosts["results"] if isinstance(hosts, dict) else hosts
            if any(h["simulated"] and h["status"] == "online" for h in hosts):
                break
            time.sleep(0.5)
        assert [h["simulated"] for h in hosts] == [True], hosts
        assert len(hosts[0]["devices"]) == 2
        # Agents start once the web server answers: started beside it, each logged its link to the
        # control plane "down (ConnectionRefusedError ...)" as warnings at every `make run`.
        assert not [line for line in lines if "Control plane link" in line], "".join(lines)
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
    assert code == 0, "".join(lines)
    assert "[run] all processes stopped" in "".join(lines)
    for pid in children:
        assert not _alive(pid)
        assert _group_members(pid) == []  # the worker's pool processes too

    # A second start would not create (or print) another admin.
    rerun = subprocess.run(
        [sys.executable, "manage.py", "bootstrap_admin"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert "password" not in rerun.stdout and "exists" in rerun.stdout
