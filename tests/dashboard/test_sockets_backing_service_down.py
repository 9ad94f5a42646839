"""Dashboard sockets while the database cannot serve: the handshake is refused (daphne answers HTTP
403, live.js then asks the page, which answers 503, and retries with back-off), a socket already
accepted is closed with 4503 (try again); one WARNING line each, no traceback. They used to raise
out of the ASGI app: daphne answered the handshake with HTTP 500 (closed an open socket with 1011)
and logged an "Exception inside application" traceback for every socket of every open page."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from dashboard import snapshots
from django.contrib.sessions.backends.db import SessionStore
from django.db import InterfaceError, OperationalError
from registry.models import ServedModel

from gpu_agent.protocol import CLOSE_TRY_AGAIN
from tests.control_plane.test_api_backing_services import _django_error, _down
from tests.dashboard.test_dashboard_access_revoked import browser, signed_in

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("close_worker_thread_connections"),
]

GONE = _django_error("server closed the connection unexpectedly", psycopg.OperationalError("closed"))
OUTAGES = [GONE, InterfaceError("connection already closed")]


def logged_once_without_traceback(caplog: pytest.LogCaptureFixture, path: str) -> None:
    """One WARNING naming the socket's path, no traceback, and nothing at ERROR (daphne's
    "Exception inside application" is logged at ERROR with one)."""
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and path in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert warnings[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("error", OUTAGES, ids=str)
async def test_it_refuses_the_handshake_of_a_socket_whose_session_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    _, session_id = await signed_in()
    monkeypatch.setattr(SessionStore, "_get_session_from_db", _down(error))
    comm = browser("/ws/dashboard/overview/", session_id)
    with caplog.at_level(logging.WARNING):
        connected, _ = await comm.connect()
        assert not connected  # closed before accept(): daphne answers the handshake with HTTP 403
        await comm.wait()
    assert comm.future.exception() is None
    logged_once_without_traceback(caplog, "/ws/dashboard/overview/")


async def test_it_refuses_the_handshake_of_a_socket_whose_subject_cannot_be_read(
    served_model: ServedModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, session_id = await signed_in()
    monkeypatch.setattr(ServedModel.objects, "filter", _down(GONE))  # the consumer's prepare()
    path = f"/ws/dashboard/models/{served_model.pk}/"
    comm = browser(path, session_id)
    with caplog.at_level(logging.WARNING):
        connected, _ = await comm.connect()
        assert not connected
        await comm.wait()
    assert comm.future.exception() is None
    logged_once_without_traceback(caplog, path)


async def test_it_closes_an_accepted_socket_whose_first_read_fails_with_try_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, session_id = await signed_in()
    monkeypatch.setattr(snapshots, "jobs", _down(GONE))  # the snapshot sent after accept()
    comm = browser("/ws/dashboard/jobs/", session_id)
    with caplog.at_level(logging.WARNING):
        assert (await comm.connect())[0]
        assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_TRY_AGAIN}
        await comm.wait()
    assert comm.future.exception() is None
    logged_once_without_traceback(caplog, "/ws/dashboard/jobs/")


async def test_a_database_error_that_is_no_outage_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing table is a programming error, not "try again later": it stays daphne's 500."""
    _, session_id = await signed_in()
    missing: Any = _django_error("no such table: django_session", None)
    monkeypatch.setattr(SessionStore, "_get_session_from_db", _down(missing))
    with pytest.raises(OperationalError, match="no such table"):
        await browser("/ws/dashboard/overview/", session_id).connect()
