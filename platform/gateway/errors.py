"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Every error a client sees has this shape, the engine's included: vLLM 0.32 answers
``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`` (the type a class
name or an HTTP phrase, the code the status as an integer) and older vLLM ``{"object": "error",
"message", "type", "param", "code"}``; ``engine_error`` rewrites both, keeping status and message.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from core.unavailable import RETRY_AFTER_S, backing_service_unavailable
from gateway.request_ids import RequestLog

log = RequestLog(logging.getLogger(__name__))  # its lines name the request (request_ids.current)


@dataclass
class GatewayError(Exception):
    """A request the gateway answers itself with an error body.

    ``retry_after_s`` becomes a ``Retry-After`` header (429 and 503), and ``retry_after_ms`` a
    ``retry-after-ms`` header, the same wait to the millisecond, which OpenAI's SDKs read before
    Retry-After's whole seconds. ``retry`` False becomes ``x-should-retry: false``, which OpenAI's
    SDKs obey over their own rule (they retry every 5xx, twice by default): for an error that a
    retry of the same request would only repeat. ``extra_headers`` go out as they are: a refused
    key's ``x-ratelimit-*`` (quota.RateLimits), as OpenAI sends them on its 429s.
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after_s: int | None = None
    retry: bool | None = None
    retry_after_ms: int | None = None
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.status} {self.message}"

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json")]
        if self.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="gateway"'))
        if self.retry_after_s is not None:
            headers.append((b"retry-after", str(self.retry_after_s).encode()))
        if self.retry_after_ms is not None:
            headers.append((b"retry-after-ms", str(self.retry_after_ms).encode()))
        if self.retry is not None:
            headers.append((b"x-should-retry", b"true" if self.retry else b"false"))
        return headers + self.extra_headers


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, "invalid_request_error", "invalid_api_key")


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404, f"The model '{model}' does not exist.", "invalid_request_error", "model_not_found", "model"
    )


def rate_limited(
    message: str, retry_after_ms: int, code: str, headers: list[tuple[bytes, bytes]] | None = None
) -> GatewayError:
    """A 429 to retry in ``retry_after_ms``: Retry-After is that wait rounded up to whole seconds
    (at least 1, as HTTP has no finer unit), retry-after-ms the wait itself."""
    wait_ms = max(1, retry_after_ms)
    return GatewayError(
        429,
        message,
        "rate_limit_error",
        code,
        retry_after_s=-(-wait_ms // 1000),
        retry_after_ms=wait_ms,
        extra_headers=headers or [],
    )


def unavailable(message: str, retry_after_s: int, code: str = "no_healthy_replica") -> GatewayError:
    return GatewayError(503, message, "service_unavailable", code, None, retry_after_s)


def upstream_lost(message: str, timed_out: bool, retry: bool | None = None) -> GatewayError:
    """The engine failed (or went silent) after it had started to answer."""
    if timed_out:
        return GatewayError(504, message, "server_error", "upstream_timeout", retry=retry)
    return GatewayError(502, message, "server_error", "upstream_failed", retry=retry)


def error_status(body: dict[str, Any]) -> int:
    """The HTTP status an engine's ``{"error": {...}}`` names (its ``code``, as vLLM's), else 500."""
    error = body.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if type(code) is int and 400 <= code <= 599 else 500


def engine_error(status: int, body: Any) -> GatewayError:
    """An engine's error (HTTP ``status`` >= 400; ``body`` its decoded JSON, None if it was not
    JSON) in the gateway's shape, with the engine's message and a string ``param`` if it named one."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]  # else older vLLM's flat {"object": "error", "message", ...}
    message, param, code = f"The engine answered HTTP {status}.", None, None
    if isinstance(body, dict):
        detail = body.get("message", body.get("detail"))  # "detail": a bare FastAPI/Starlette error
        message = detail if isinstance(detail, str) and detail else message
        param = body.get("param") if isinstance(body.get("param"), str) else None
        code = body.get("code") if isinstance(body.get("code"), str) else None  # vLLM's is the status
    if status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return GatewayError(status, message, kind, code, param)


def internal_error(exc: Exception) -> GatewayError:
    """The answer to a failure of the gateway itself before it answered, logged: a 503 to retry
    when the database or Redis cannot serve now (core/unavailable.py), else a 500."""
    if backing_service_unavailable(exc):
        log.error("gateway: a backing service is unavailable", exc_info=exc)
        return unavailable(
            "The service is temporarily unavailable; retry later.", RETRY_AFTER_S, "service_unavailable"
        )
    log.error("gateway: request failed", exc_info=exc)
    return GatewayError(
        500, "The server had an error while processing your request.", "server_error", "internal_error"
    )
