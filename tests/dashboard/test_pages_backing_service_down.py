"""HTML pages while the database or Redis cannot serve: a 503 page with Retry-After (the API's JSON
503s: tests/control_plane/test_api_backing_services.py), not Django's bare "Server Error (500)"."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from accounts import login_limits
from dashboard import views
from django.test import Client
from django.urls import reverse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from registry.models import ServedModel

from tests.control_plane.test_api_backing_services import _django_error, _down


def _is_the_unavailable_page(response: Any) -> bool:
    page = response.content.decode()
    return (
        response.status_code == 503
        and response["Retry-After"] == "5"
        and response["Content-Type"].startswith("text/html")
        and "Retry in\n      5 seconds." in page
    )


@pytest.mark.django_db
@pytest.mark.parametrize("error", [RedisConnectionError("Connection refused"), RedisTimeoutError("Timeout")])
def test_signing_in_with_the_cache_down_is_the_503_page(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    monkeypatch.setattr(login_limits, "begin_attempt", _down(error))
    client = Client(raise_request_exception=False)
    response = client.post(reverse("login"), {"username": "alice", "password": "x"})
    assert _is_the_unavailable_page(response), (response.status_code, response.content[:300])


def test_a_dashboard_page_with_the_database_gone_is_the_503_page(
    admin_client: Client, served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = _django_error("server closed the connection", psycopg.OperationalError("closed"))
    monkeypatch.setattr(views, "_gateway_latency_ms", _down(gone))
    admin_client.raise_request_exception = False
    response = admin_client.get(reverse("dashboard:model-detail", args=[served_model.pk]))
    assert _is_the_unavailable_page(response), (response.status_code, response.content[:300])


def test_a_database_error_that_is_no_outage_stays_a_500(
    admin_client: Client, served_model: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's "no such table" is an OperationalError too: a missing migration is not "retry later"."""
    monkeypatch.setattr(views, "_gateway_latency_ms", _down(_django_error("no such table: x", None)))
    admin_client.raise_request_exception = False
    response = admin_client.get(reverse("dashboard:model-detail", args=[served_model.pk]))
    assert response.status_code == 500
    assert "Retry-After" not in response
