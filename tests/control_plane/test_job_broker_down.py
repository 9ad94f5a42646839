"""Starting a job while the Celery broker cannot take it: a JSON 503 with Retry-After and no job
row, rather than a 201 for a job that then fails with "Could not enqueue the job" (the dashboard's
form: tests/dashboard/test_dashboard_job_broker_down.py).

Transactional tests: the message goes out when the job's row commits, which the rolled-back
transaction of an ordinary test never does.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from jobs import services
from jobs.models import Job, JobStatus
from jobs.tasks import run_job
from kombu.exceptions import OperationalError as KombuOperationalError
from rest_framework.test import APIClient

from core.unavailable import BrokerUnavailable

URL = "/api/v1/jobs/"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)
# What publishing raises with REDIS_URL pointing at a Redis that refuses connections.
REDIS_REFUSED = KombuOperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


@pytest.fixture
def broker_refuses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Publishing fails as with Redis down; returns the job ids it was asked to send."""
    return refuse_jobs(monkeypatch)


def refuse_jobs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make publishing fail as with Redis down; returns the job ids it was asked to send."""
    asked: list[int] = []

    def refuse(args: tuple[int], task_id: str) -> None:
        asked.append(args[0])
        raise REDIS_REFUSED

    monkeypatch.setattr(run_job, "apply_async", refuse)
    return asked


@pytest.fixture
def embedded_broker_gone() -> Iterator[None]:
    """The embedded (filesystem) broker's queue folder is missing: a real publish fails."""
    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("the embedded broker's folders are not in use with REDIS_URL or CELERY_BROKER_URL")
    queue = Path(settings.BROKER_DIR) / "queue"
    aside = queue.with_name(queue.name + "-aside")
    queue.rename(aside)
    try:
        yield
    finally:
        shutil.rmtree(queue, ignore_errors=True)
        aside.rename(queue)


def test_the_api_answers_503_with_retry_after_and_keeps_no_job(
    admin_client: APIClient, broker_refuses: list[int]
) -> None:
    response = admin_client.post(URL, {"kind": "noop", "params": {"steps": 3}}, format="json")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    assert response.json()["detail"] == "The job queue cannot take jobs right now; no job was created."
    assert len(broker_refuses) == 1  # it was sent after the row was stored, and then withdrawn
    assert not Job.objects.exists()


def test_a_real_publish_to_a_missing_broker_folder_is_a_503_too(
    admin_client: APIClient, embedded_broker_gone: None
) -> None:
    response = admin_client.post(URL, {"kind": "noop"}, format="json")
    assert (response.status_code, response["Retry-After"]) == (503, "5")
    assert not Job.objects.exists()


def test_a_job_a_worker_already_took_is_kept_although_the_send_reported_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message can reach the broker before the error is reported (a timeout): the job stays."""

    def sent_then_failed(args: tuple[int], task_id: str) -> None:
        Job.objects.filter(pk=args[0]).update(status=JobStatus.RUNNING)  # a worker claimed it
        raise REDIS_REFUSED

    monkeypatch.setattr(run_job, "apply_async", sent_then_failed)
    job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_another_publish_error_withdraws_the_job_and_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise TypeError("cannot serialize")

    monkeypatch.setattr(run_job, "apply_async", broken)
    with pytest.raises(TypeError, match="cannot serialize"):
        services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert not Job.objects.exists()


def test_the_broker_error_is_kept_as_the_cause(broker_refuses: list[int]) -> None:
    with pytest.raises(BrokerUnavailable) as raised:
        services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert raised.value.__cause__ is REDIS_REFUSED


def test_a_job_created_inside_a_callers_transaction_is_sent_when_that_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nesting is allowed (it raised "A durable atomic block cannot be nested"); the message waits
    for the caller's commit, and a rolled-back caller sends nothing."""
    sent: list[int] = []
    monkeypatch.setattr(run_job, "apply_async", lambda args, task_id: sent.append(args[0]))
    with transaction.atomic():
        job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
        assert sent == []
    assert sent == [job.pk]
    with transaction.atomic():
        services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
        transaction.set_rollback(True)
    assert sent == [job.pk]
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]


def test_a_refusal_at_the_callers_commit_still_withdraws_the_job(broker_refuses: list[int]) -> None:
    with transaction.atomic():
        job = services.create_job("noop", {"steps": 1, "delay_s": 0.0}, None)
    assert broker_refuses == [job.pk]
    assert not Job.objects.exists()


# Run in a process of its own, whose settings see REDIS_URL: a job POSTed through the API.
POST_A_JOB = """
import json, time
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from accounts.models import Role, User
from accounts.services import issue_api_token
from config.celery import app
from jobs.models import Job
from rest_framework.test import APIClient
alice = User.objects.create_user(username="alice", password="alice-pw-9f2k", role=Role.ADMIN)
client = APIClient()
client.credentials(HTTP_AUTHORIZATION="Token " + issue_api_token(alice, "test").plaintext)
started = time.monotonic()
response = client.post("/api/v1/jobs/", {"kind": "noop"}, format="json")
print(json.dumps({
    "took_s": time.monotonic() - started,
    "status": response.status_code,
    "retry_after": response.get("Retry-After"),
    "jobs": Job.objects.count(),
    "transport": app.conf.broker_transport_options,
    "connect_s": app.conf.broker_connection_timeout,
    "retries": app.conf.task_publish_retry_policy["max_retries"],
}))
"""


def post_a_job_in_a_process(broker_env: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    """POST a job from a process of its own whose settings see ``broker_env``; what it observed."""
    unset = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CACHE_URL", "SECRET_KEY", "DEBUG")
    env = {
        **{k: v for k, v in os.environ.items() if k not in unset},
        "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "VAR_DIR": str(tmp_path),
        "ALLOWED_HOSTS": "testserver",
        **broker_env,
    }
    try:
        command = [sys.executable, "-c", POST_A_JOB]
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the job's POST had no answer within a minute (the process was killed)")
    assert out.returncode == 0, out.stderr
    posted: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return posted


REDIS_TIMEOUTS = {"socket_timeout": 3.0, "socket_connect_timeout": 3.0}
AMQP_TIMEOUTS = {"confirm_publish": True, "read_timeout": 3.0, "write_timeout": 3.0}


@pytest.mark.parametrize(
    ("variable", "url", "transport"),
    [
        ("REDIS_URL", "redis://127.0.0.1:{port}/0", REDIS_TIMEOUTS),
        # RabbitMQ (CELERY_BROKER_URL): its handshake waited for ever, holding the POST.
        ("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:{port}//", AMQP_TIMEOUTS),
    ],
)
def test_a_broker_that_accepts_but_never_answers_is_a_503_within_seconds(
    tmp_path: Path, variable: str, url: str, transport: dict[str, float]
) -> None:
    """A blackholed broker (a partition, a firewall dropping packets) used to hold the job's POST
    for ever: kombu's sockets had no timeout. Here the broker is a socket that completes the TCP
    handshake (the kernel's backlog) and never reads nor answers."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        posted = post_a_job_in_a_process({variable: url.format(port=hole.getsockname()[1])}, tmp_path)
    # Each connect and read waits at most 3 s; connecting gives up after one such wait, and a
    # failed publish is retried once: a fresh connection fails in about 3 s, a pooled one in 9
    # (tests/control_plane/test_jobs_rabbitmq.py has RabbitMQ stop answering a pooled one).
    assert posted["transport"] == transport
    assert (posted["connect_s"], posted["retries"]) == (3.0, 1)
    assert (posted["status"], posted["retry_after"], posted["jobs"]) == (503, "5", 0)
    assert posted["took_s"] < 20, posted


def test_a_rabbitmq_that_refuses_connections_is_a_503_at_once(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port just free: nothing listens there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    refused = f"amqp://guest:guest@127.0.0.1:{port}//"
    posted = post_a_job_in_a_process({"CELERY_BROKER_URL": refused}, tmp_path)
    assert posted["transport"] == AMQP_TIMEOUTS
    assert (posted["status"], posted["retry_after"], posted["jobs"]) == (503, "5", 0)
    assert posted["took_s"] < 5, posted
