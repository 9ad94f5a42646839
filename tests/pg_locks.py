"""For race tests on PostgreSQL's row locks: which backend this thread talks to, and waiting until
a backend waits for a lock (pg_locks is read live, even inside a transaction)."""

from __future__ import annotations

import time

from django.db import connection


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])


def wait_until_blocked(pid: int | None = None, timeout: float = 10.0) -> None:
    """Until backend ``pid`` (any backend but this thread's when None) waits for a lock."""
    deadline = time.monotonic() + timeout
    query = "SELECT 1 FROM pg_locks WHERE NOT granted AND " + (
        "pid = %s" if pid else "pid <> pg_backend_pid()"
    )
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(query, [pid] if pid else [])
            if cursor.fetchone() is not None:
                return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid or 'other than this one'} never waited for a lock")
