"""Whether an exception means a backing service (the database, Redis, the job broker) is
unavailable for now.

Such a failure is worth a 503 with Retry-After (the API, the /v1 gateway): the request was fine and
may succeed in a moment. Only connection-level and transient causes count: a programming error that
the database reports (on SQLite "no such table" is an OperationalError too, as are some of
PostgreSQL's limit and configuration errors) stays a 500, so a missing migration is not disguised
as "retry later".
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# PostgreSQL SQLSTATEs of a transient refusal: class 08 (connection exception) is matched by prefix.
TRANSIENT_SQLSTATES = frozenset(
    {
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now
        "53300",  # too_many_connections
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
    }
)
RETRY_AFTER_S = 5


class BrokerUnavailable(Exception):
    """The Celery broker did not take a message; the text says so to the client (the 503's detail)
    and what happened to the request (raised from the broker's own error)."""


def backing_service_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database, Redis or the broker cannot serve now (see the module doc)."""
    if isinstance(exc, BrokerUnavailable | RedisConnectionError | RedisTimeoutError | InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if cause is not None and type(cause).__module__.startswith("psycopg"):
        sqlstate = getattr(cause, "sqlstate", None)
        # None: refused before any SQL (connection refused, server gone, connection closed).
        return sqlstate is None or sqlstate.startswith("08") or sqlstate in TRANSIENT_SQLSTATES
    return "database is locked" in str(exc)  # SQLite: another writer holds it past the timeout
