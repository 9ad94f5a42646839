"""Fixtures for control-plane tests: users of each role, authenticated clients, a real worker."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from accounts.models import Role, User
from accounts.services import issue_api_token
from django.conf import settings
from rest_framework.test import APIClient

from .worker import CeleryWorker


def _make_user(username: str, role: Role) -> User:
    return User.objects.create_user(username=username, password=f"{username}-pw-9f2k", role=role)


@pytest.fixture(scope="session", autouse=True)
def _remove_test_broker_folder() -> Iterator[None]:
    """Delete this run's filesystem-broker folder at the end (see BROKER_DIR in settings)."""
    yield
    folder = Path(settings.BROKER_DIR)
    if "platform-test-broker" in folder.parts:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def alice(db: None) -> User:
    """An admin."""
    return _make_user("alice", Role.ADMIN)


@pytest.fixture
def bob(db: None) -> User:
    """A viewer."""
    return _make_user("bob", Role.VIEWER)


@pytest.fixture
def charlie(db: None) -> User:
    """Another viewer: the outsider to bob's own resources."""
    return _make_user("charlie", Role.VIEWER)


def token_client(user: User) -> APIClient:
    """A client authenticating with a freshly issued API token (as scripts do)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user, 'test').plaintext}")
    return client


@pytest.fixture
def admin_client(alice: User) -> APIClient:
    return token_client(alice)


@pytest.fixture
def viewer_client(bob: User) -> APIClient:
    return token_client(bob)


@pytest.fixture
def outsider_client(charlie: User) -> APIClient:
    return token_client(charlie)


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., CeleryWorker]]:
    """Start a real Celery worker subprocess on this run's broker and test database.

    Returns a callable (taking extra environment variables of the worker) so a test can enqueue
    work before the worker exists. Every worker started is stopped (SIGTERM, then SIGKILL) before
    the database is flushed.
    """
    workers: list[CeleryWorker] = []

    def start(**extra_env: str) -> CeleryWorker:
        worker = CeleryWorker(**extra_env)
        workers.append(worker)
        worker.start()
        return worker

    CeleryWorker.purge_queue()
    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def module_worker(django_db_setup: None, django_db_blocker: Any) -> Iterator[CeleryWorker]:
    """One worker for a whole test module (startup costs seconds); use with transactional tests."""
    with django_db_blocker.unblock():
        CeleryWorker.purge_queue()
        worker = CeleryWorker()
        worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def model_payload() -> dict[str, Any]:
    return {
        "name": "llama-3-8b",
        "source": "meta-llama/Meta-Llama-3-8B-Instruct",
        "dtype": "bfloat16",
        "tensor_parallel_size": 2,
        "max_context_length": 8192,
        "slo_ttft_p99_ms": 500.0,
        "slo_tbt_p99_ms": 50.0,
        "slo_attainment_pct": 90.0,
        "engine_options": {"gpu_memory_utilization": 0.9},
    }
