"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class GatewayError(Exception):
    """A request the gateway answers itself with an error body.

    ``retry_after_s`` becomes a ``Retry-After`` header (429 and 503).
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after_s: int | None = None

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
        return headers


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, "invalid_request_error", "invalid_api_key")


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404, f"The model '{model}' does not exist.", "invalid_request_error", "model_not_found", "model"
    )


def rate_limited(message: str, retry_after_s: int, code: str) -> GatewayError:
    return GatewayError(429, message, "rate_limit_error", code, None, max(1, retry_after_s))


def unavailable(message: str, retry_after_s: int) -> GatewayError:
    return GatewayError(503, message, "service_unavailable", "no_healthy_replica", None, retry_after_s)
