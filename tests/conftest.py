"""Suite-wide pytest configuration. Keep it minimal: fixtures of one area live in its conftest.py.

Django is configured by pytest-django from pyproject.toml (``DJANGO_SETTINGS_MODULE``, with
``platform/`` on ``pythonpath``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from django.core.cache import cache
from django.db import connections


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    """Every test starts with an empty cache: failed sign-ins (accounts/login_limits.py) and the
    token endpoint's throttle count there per process, so one test's failures would lock another
    test's users, depending on the order the tests run in."""
    cache.clear()
    yield


@pytest_asyncio.fixture
async def close_worker_thread_connections() -> AsyncIterator[None]:
    """Close the database connection of asgiref's worker thread after the test.

    Consumers' ORM calls run on that thread; its connection outlives the test, and PostgreSQL
    cannot drop the test database while a session is open. Use it in the asynchronous tests of
    consumers: ``pytest.mark.usefixtures("close_worker_thread_connections")``.
    """
    yield
    await database_sync_to_async(connections.close_all)()
