"""The /v1 gateway when it fails itself before answering: the database or Redis unavailable is a
503 to retry, anything else a 500; both in OpenAI's shape with the request's x-request-id (daphne's
own HTML 500 page carried neither)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import psycopg
import pytest
from django.db import OperationalError
from gateway import services

from tests.gateway.asgi_driver import CHAT, app_with, call

pytestmark = pytest.mark.usefixtures("gateway_data")


def _refused_connection() -> OperationalError:
    try:
        raise OperationalError("connection refused") from psycopg.OperationalError("connection refused")
    except OperationalError as error:
        return error


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [(_refused_connection(), 503, "service_unavailable"), (RuntimeError("bug"), 500, "internal_error")],
)
def test_a_failure_before_the_answer_is_an_openai_error_with_the_request_id(
    monkeypatch: pytest.MonkeyPatch, gateway_data: dict[str, Any], failure: Exception, status: int, code: str
) -> None:
    def authenticate(*args: Any) -> Any:
        raise failure

    monkeypatch.setattr(services, "authenticate", authenticate)
    app = app_with(lambda request: httpx.Response(200, json={}))
    result = asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"]))
    assert result.status == status
    assert json.loads(result.body)["error"]["code"] == code
    assert result.headers[b"x-request-id"].startswith(b"req_")
    assert (b"retry-after" in result.headers) == (status == 503)
