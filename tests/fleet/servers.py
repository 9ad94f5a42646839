"""Real processes for integration tests: the ASGI server (daphne) and a GPU agent.

The server opens the test database: pytest-django's file-based SQLite test database (or the
PostgreSQL test database when DATABASE_URL is set), handed over through DJANGO_DB_NAME, as the
Celery worker of tests/control_plane is. Tests using these must be transactional, so that rows are
committed where the subprocesses can see them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Poll until ``predicate()``; returns the seconds it took. Fails naming ``what``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic() - start


class Process:
    """A subprocess in its own process group whose output is captured (shown when a test fails)."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.lines: list[str] = []
        self.popen: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    def log(self) -> str:
        return "".join(self.lines)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL, no goodbye (the process group: an agent's engines die with it)."""
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
            assert self.popen is not None
            self.popen.wait()

    def stop(self, grace_s: float = 20.0) -> None:
        if self.popen is None:
            return
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # whatever the leader left behind
        self.popen.wait()
        print(f"--- {self.name} log ---\n{self.log()}")


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "platform"), str(ROOT), env.get("PYTHONPATH", "")])
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env["DJANGO_DB_NAME"] = str(connection.settings_dict["NAME"])  # the test database
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class AsgiServer(Process):
    """``daphne config.asgi:application`` on a free port, on the test database."""

    def __init__(self, **settings_env: str) -> None:
        self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(self.port),
            "config.asgi:application",
        ]
        super().__init__("daphne", argv, base_env(**settings_env))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        super().start()

        def healthy() -> bool:
            if not self.alive():
                raise AssertionError(f"daphne exited:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/health/", timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_until(healthy, 60, "daphne to answer /api/health/", interval_s=0.2)


class AgentProcess(Process):
    """``python -m gpu_agent`` for one host, with its state under ``state_dir``."""

    def __init__(self, control_plane: str, token: str, name: str, state_dir: Path, *extra: str) -> None:
        argv = [
            sys.executable,
            "-m",
            "gpu_agent",
            "--control-plane",
            control_plane,
            "--token",
            token,
            "--name",
            name,
            "--address",
            "127.0.0.1",
            "--state-dir",
            str(state_dir),
            *extra,
        ]
        super().__init__(f"agent {name}", argv, base_env())
