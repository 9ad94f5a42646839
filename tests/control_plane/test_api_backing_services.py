"""The API while the database or Redis is unavailable: a JSON 503 with Retry-After, not Django's
HTML 500 page (seen with Redis down: POST /api/v1/auth/token/ could not count the sign-in)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from accounts import login_limits
from django.db import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from registry.api.views import ServedModelViewSet
from rest_framework.test import APIClient


def _down(error: Exception) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


@pytest.mark.django_db
def test_sign_in_with_the_cache_down_is_a_json_503(monkeypatch: pytest.MonkeyPatch, alice: Any) -> None:
    monkeypatch.setattr(login_limits, "begin_attempt", _down(RedisConnectionError("Connection refused")))
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": "alice", "password": "x", "name": "t"}, format="json"
    )
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    assert "retry later" in response.json()["detail"]


def _django_error(message: str, cause: Exception | None) -> OperationalError:
    """An OperationalError as Django's DatabaseErrorWrapper raises it: ``from`` the driver's."""
    try:
        raise OperationalError(message) from cause
    except OperationalError as error:
        return error


@pytest.mark.parametrize(
    "error",
    [
        _django_error("connection refused", psycopg.OperationalError("connection refused")),
        _django_error("database is locked", None),  # SQLite, past its busy timeout
    ],
)
def test_a_database_that_cannot_serve_now_is_a_json_503(
    monkeypatch: pytest.MonkeyPatch, viewer_client: APIClient, error: OperationalError
) -> None:
    monkeypatch.setattr(ServedModelViewSet, "get_queryset", _down(error))
    response = viewer_client.get("/api/v1/models/")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.json()["detail"].startswith("The database or cache is unavailable")


def test_a_schema_error_stays_a_500_not_retry_later(
    monkeypatch: pytest.MonkeyPatch, viewer_client: APIClient
) -> None:
    """On SQLite a missing table (a missing migration) is an OperationalError too."""
    monkeypatch.setattr(ServedModelViewSet, "get_queryset", _down(_django_error("no such table: x", None)))
    with pytest.raises(OperationalError):  # the test client re-raises what would be a 500
        viewer_client.get("/api/v1/models/")
