"""Fixtures for planning tests: users and clients (shared with tests/control_plane) and hosts."""

from __future__ import annotations

import pytest
from inventory.models import Host

from tests.control_plane.conftest import (  # noqa: F401  (fixtures)
    admin_client,
    alice,
    anon_client,
    bob,
    charlie,
    outsider_client,
    viewer_client,
)
from tests.planning.helpers import make_host


@pytest.fixture
def two_hosts(db: None) -> tuple[Host, Host]:
    return make_host("host-a"), make_host("host-b", simulated=True)
