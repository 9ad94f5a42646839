"""For race tests on PostgreSQL's row locks: which backend this thread talks to, waiting until a
backend waits for a lock (pg_locks is read live, even inside a transaction), and running one side
of a race in a thread of its own (its own connection)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

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


def in_thread(name: str, work: Callable[[], Any], errors: list[str]) -> threading.Thread:
    """Start ``work`` in a thread (closing its connection at the end); what it raises is appended
    to ``errors`` as "name: Type: message"."""

    def run() -> None:
        try:
            work()
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread
