"""A real Celery worker subprocess for tests, on the same broker and database as the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from config.celery import app

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


class CeleryWorker:
    """``celery worker`` (solo pool) consuming this test run's queue, with its log captured."""

    def __init__(self, **extra_env: str) -> None:
        self.extra_env = extra_env
        self.queue = extra_env.get("CELERY_QUEUE", settings.CELERY_TASK_DEFAULT_QUEUE)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.process: subprocess.Popen[str] | None = None

    @staticmethod
    def purge_queue() -> None:
        """Drop messages other tests left on this run's queue."""
        app.control.purge()

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "platform"), str(ROOT), env.get("PYTHONPATH", "")])
        env["DJANGO_DB_NAME"] = str(connection.settings_dict["NAME"])  # the test database
        env["CELERY_QUEUE"] = self.queue
        env["CELERY_BROKER_DIR"] = str(settings.BROKER_DIR)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config.celery",
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            f"--queues={self.queue}",
            f"--hostname=test-{os.getpid()}-{time.monotonic_ns()}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S):
            self.stop()
            raise RuntimeError("celery worker did not become ready:\n" + self.log())

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if " ready." in line:
                self._ready.set()

    def log(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-job, writing nothing."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # Cold shutdown: nothing a test worker runs needs to finish, and warm shutdown takes seconds.
        self.process.send_signal(signal.SIGQUIT)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        # Shown by pytest when the test failed.
        print(f"--- celery worker log ---\n{self.log()}")
