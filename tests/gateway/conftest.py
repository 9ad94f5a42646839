"""Fixtures of the gateway tests: the live stack (module-scoped), data for unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from accounts.models import Role, User
from agents.models import Replica
from deployments.models import Deployment, ObservedState
from django.core.management import call_command
from django.db import connection
from django.test.utils import setup_databases, teardown_databases
from registry.models import ServedModel

from tests.browser.conftest import browser  # noqa: F401  (the headless Chromium fixture)
from tests.fleet.tiny_stack import tiny_deployment
from tests.gateway.gateway_stack import Stack


@contextmanager
def live_test_database(session: pytest.Session) -> Iterator[None]:
    """The test database, even when no collected test is marked for one.

    pytest-django creates test databases only for the collected tests that ask for one (a
    ``django_db`` mark or a db fixture). The live-stack tests cannot: a test transaction would hide
    their rows from the servers and a transactional test's flush would remove the stack's rows
    after the first test. Without this, the connection would still name the DEVELOPMENT database.
    """
    asked = any(
        item.get_closest_marker("django_db")
        or {"db", "transactional_db"} & set(getattr(item, "fixturenames", ()))
        for item in session.items
    )
    created = None if asked else setup_databases(verbosity=0, interactive=False, aliases={"default": None})
    try:
        name = str(connection.settings_dict["NAME"])
        assert "test" in Path(name).name, f"refusing to run the live stack on database {name}"
        try:
            yield
        finally:
            call_command("flush", interactive=False, verbosity=0)  # the test database only
    finally:
        if created is not None:
            teardown_databases(created, verbosity=0)


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    blocker = django_db_blocker
    with blocker.unblock(), live_test_database(request.session):
        state_dir = tmp_path_factory.mktemp("gateway-agent")
        # The failover test registers a host that never heartbeats; keep it "online" long enough.
        server_env = {"HOST_STALE_AFTER_S": "30", "HOST_OFFLINE_AFTER_S": "60"}
        # vLLM logs "Aborted request" only with --enable-log-requests.
        engine_options = {"extra_args": ["--enable-log-requests"]}
        with tiny_deployment(
            state_dir,
            "gateway-host",
            server_env=server_env,
            max_context_length=2048,
            engine_options=engine_options,
        ) as started:
            user = User.objects.create_user(username="enduser", password="enduser-pw-7x", role=Role.VIEWER)
            yield Stack(
                started.server,
                started.agent,
                started.host,
                started.model,
                started.deployment,
                started.replica.base_url,
                user,
                started.log_dir,
            )


@pytest.fixture
def live_db(stack: Stack, django_db_blocker: Any) -> Iterator[None]:
    """Database access in a test of the live stack (autocommit: the server sees every write)."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def gateway_data(transactional_db: None) -> dict[str, Any]:
    """A user with a key, the model "tiny" with two running replicas (a, b) on an online host."""
    from accounts.services import create_api_key
    from django.utils import timezone
    from inventory.services import mark_seen, register_host

    user = User.objects.create_user(username="alice", password="alice-pw-4k9", role=Role.VIEWER)
    issued = create_api_key(user, "unit", requests_per_minute=100, tokens_per_day=10_000)
    model = ServedModel.objects.create(
        name="tiny", source="/m", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    host = register_host("unit-host", "127.0.0.1")
    mark_seen(host)
    deployments = []
    for name in ("a", "b"):
        deployment = Deployment.objects.create(model=model, host=host, observed_state=ObservedState.RUNNING)
        Replica.objects.create(
            deployment=deployment,
            state="running",
            base_url=f"http://replica-{name}",
            reported_at=timezone.now(),
        )
        deployments.append(deployment)
    return {
        "user": user,
        "key": issued.record,
        "secret": issued.plaintext,
        "model": model,
        "host": host,
        "deployments": deployments,
    }
