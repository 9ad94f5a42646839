"""Fixtures for dashboard tests: users of each role, signed-in clients, a host with GPUs, a model."""

from __future__ import annotations

import pytest
from accounts.models import Role, User
from deployments.models import Deployment
from django.test import Client
from inventory.models import Device, DeviceKind, Host
from inventory.services import register_host
from registry.models import ServedModel

from tests.dashboard.helpers import GIB


def make_user(username: str, role: Role) -> User:
    return User.objects.create_user(username=username, password=f"{username}-pw-9f2k", role=role)


@pytest.fixture
def admin_user(db: None) -> User:
    return make_user("alice", Role.ADMIN)


@pytest.fixture
def viewer_user(db: None) -> User:
    return make_user("bob", Role.VIEWER)


@pytest.fixture
def admin_client(admin_user: User) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def viewer_client(viewer_user: User) -> Client:
    client = Client()
    client.force_login(viewer_user)
    return client


@pytest.fixture
def host(db: None) -> Host:
    host = register_host("sim-a", "127.0.0.1", simulated=True)
    for index in range(2):
        Device.objects.create(
            host=host,
            index=index,
            uuid=f"GPU-sim-a-{index}",
            name="H100",
            kind=DeviceKind.GPU,
            memory_total_bytes=80 * GIB,
        )
    return host


@pytest.fixture
def served_model(db: None) -> ServedModel:
    return ServedModel.objects.create(
        name="tiny",
        source="/models/tiny",
        tensor_parallel_size=1,
        max_context_length=256,
        slo_ttft_p99_ms=500.0,
        slo_tbt_p99_ms=50.0,
    )


@pytest.fixture
def deployment(host: Host, served_model: ServedModel) -> Deployment:
    dep = Deployment.objects.create(model=served_model, host=host)
    dep.devices.set([Device.objects.get(host=host, index=0)])
    return dep
