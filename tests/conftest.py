"""Suite-wide pytest configuration. Keep it minimal: fixtures of one area live in its conftest.py.

Django is configured by pytest-django from pyproject.toml (``DJANGO_SETTINGS_MODULE``, with
``platform/`` on ``pythonpath``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from channels.db import database_sync_to_async
from django.db import connections


@pytest_asyncio.fixture
async def close_worker_thread_connections() -> AsyncIterator[None]:
    """Close the database connection of asgiref's worker thread after the test.

    Consumers' ORM calls run on that thread; its connection outlives the test, and PostgreSQL
    cannot drop the test database while a session is open. Use it in the asynchronous tests of
    consumers: ``pytest.mark.usefixtures("close_worker_thread_connections")``.
    """
    yield
    await database_sync_to_async(connections.close_all)()
