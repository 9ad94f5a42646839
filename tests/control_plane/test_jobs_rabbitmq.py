"""Jobs on RabbitMQ (CELERY_BROKER_URL=amqp://...): published by the API, run by a real worker, and
refused with a 503 when RabbitMQ stops answering.

Needs a RabbitMQ: RABBITMQ_URL names it (CI's second pass sets amqp://guest:guest@127.0.0.1:5672//);
skipped without it. Each test uses a queue of its own and deletes it afterwards. A RabbitMQ that is
down or refuses connections needs none: tests/control_plane/test_job_broker_down.py.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from accounts.models import User
from accounts.services import issue_api_token
from django.db import connection
from jobs.models import JobStatus
from kombu import Connection

from .test_worker import wait_for
from .worker import CeleryWorker

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "")
ROOT = Path(__file__).resolve().parents[2]
POST_TIMEOUT_S = 60
pytestmark = [
    pytest.mark.skipif(not RABBITMQ_URL, reason="needs a RabbitMQ: set RABBITMQ_URL=amqp://..."),
    pytest.mark.django_db(transaction=True),
]

# Run in a process of its own whose settings see CELERY_BROKER_URL: POSTs a job for each line read
# from stdin (with TEST_API_TOKEN), answering each with a JSON line.
POST_JOBS = """
import json, os, sys, time
import django
django.setup()
from django.core.management import call_command
from jobs.models import Job
from rest_framework.test import APIClient
if os.environ.get("MIGRATE"):
    call_command("migrate", verbosity=0)
    from accounts.models import Role, User
    from accounts.services import issue_api_token
    alice = User.objects.create_user(username="alice", password="alice-pw-9f2k", role=Role.ADMIN)
    os.environ["TEST_API_TOKEN"] = issue_api_token(alice, "test").plaintext
client = APIClient()
client.credentials(HTTP_AUTHORIZATION="Token " + os.environ["TEST_API_TOKEN"])
for _ in sys.stdin:
    started = time.monotonic()
    response = client.post("/api/v1/jobs/", {"kind": "noop", "params": {"steps": 3}}, format="json")
    print("POSTED " + json.dumps({
        "took_s": time.monotonic() - started,
        "status": response.status_code,
        "id": response.json().get("id"),
        "jobs": Job.objects.count(),
    }), flush=True)
"""


class Poster:
    """The POST_JOBS process, on RabbitMQ at ``broker_url`` and the queue ``celery_queue``."""

    def __init__(self, broker_url: str, celery_queue: str, **env: str) -> None:
        unset = ("REDIS_URL", "CACHE_URL", "CELERY_BROKER_URL")
        full_env = {
            **{k: v for k, v in os.environ.items() if k not in unset},
            "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "ALLOWED_HOSTS": "testserver",
            "CELERY_BROKER_URL": broker_url,
            "CELERY_QUEUE": celery_queue,
            **env,
        }
        command = [sys.executable, "-c", POST_JOBS]
        self.process = subprocess.Popen(
            command, env=full_env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("POSTED "):
                self.answers.put(json.loads(line.removeprefix("POSTED ")))
        self.answers.put(None)  # it ended

    def post(self) -> dict[str, Any]:
        """POST a job; what the process observed."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        try:
            posted = self.answers.get(timeout=POST_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"the job's POST had no answer within {POST_TIMEOUT_S} s") from None
        if posted is None:
            raise AssertionError(f"the posting process ended (exit code {self.process.wait()})")
        return posted

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class BlackholingProxy:
    """A TCP proxy to RabbitMQ that can stop answering: from ``blackhole()`` on, it reads what
    either side sends and forwards nothing, keeping every connection open (a partition)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.holed = threading.Event()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def blackhole(self) -> None:
        self.holed.set()

    def close(self) -> None:
        self.closed.set()
        for sock in self.sockets:
            sock.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                if not select.select([source], [], [], 0.1)[0]:
                    continue
                data = source.recv(65536)
                if not data:
                    return
                if not self.holed.is_set():
                    sink.sendall(data)
        except OSError:
            return


@pytest.fixture
def amqp_queue() -> Iterator[str]:
    """A queue of this test's own on RabbitMQ, deleted with whatever messages are left on it."""
    name = f"test-amqp-{uuid.uuid4().hex}"
    yield name
    with Connection(RABBITMQ_URL, connect_timeout=5) as broker:
        channel = broker.channel()
        channel.queue_delete(name)
        channel.close()


@pytest.fixture
def rabbitmq_worker(amqp_queue: str) -> Iterator[CeleryWorker]:
    """A real Celery worker consuming ``amqp_queue`` on RabbitMQ, on the test database."""
    worker = CeleryWorker(CELERY_BROKER_URL=RABBITMQ_URL, CELERY_QUEUE=amqp_queue)
    worker.start()
    yield worker
    worker.stop()


def test_a_job_posted_to_the_api_goes_through_rabbitmq_to_a_worker_that_runs_it(
    rabbitmq_worker: CeleryWorker, amqp_queue: str, alice: User
) -> None:
    token = issue_api_token(alice, "test").plaintext
    poster = Poster(
        RABBITMQ_URL, amqp_queue, TEST_API_TOKEN=token, DJANGO_DB_NAME=str(connection.settings_dict["NAME"])
    )
    try:
        posted = poster.post()
    finally:
        poster.close()
    assert posted["status"] == 201, posted
    job = wait_for(posted["id"], lambda job: not job.is_active)
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"steps_done": 3}), job.error
    # Both sides were on RabbitMQ: the worker consumed nothing else.
    assert "Connected to amqp://" in rabbitmq_worker.log()
    assert f"Task jobs.run_job[{job.celery_id}] succeeded" in rabbitmq_worker.log()


def test_a_rabbitmq_that_stops_answering_a_pooled_connection_is_a_503_within_seconds(
    amqp_queue: str, tmp_path: Path
) -> None:
    """An AMQP publish is not answered: without publisher confirms, a publish to a RabbitMQ that no
    longer answers went into the socket's buffer, the POST answered 201 and the job's message was
    lost (the job stayed queued). Now the publish waits for the broker's ack (read_timeout)."""
    url = urlsplit(RABBITMQ_URL)
    proxy = BlackholingProxy((url.hostname or "127.0.0.1", url.port or 5672))
    proxied = url._replace(netloc=f"{url.netloc.rpartition('@')[0]}@127.0.0.1:{proxy.port}").geturl()
    poster = Poster(proxied, amqp_queue, VAR_DIR=str(tmp_path), MIGRATE="1", DATABASE_URL="")
    try:
        first = poster.post()  # opens the connection the process keeps in its pool
        proxy.blackhole()
        second = poster.post()
    finally:
        proxy.close()
        poster.close()
    assert (first["status"], first["jobs"]) == (201, 1), first
    assert (second["status"], second["jobs"]) == (503, 1), second
    assert second["took_s"] < 20, second
