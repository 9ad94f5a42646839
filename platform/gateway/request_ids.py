"""Request ids: the ``x-request-id`` of every /v1 answer, and the gateway's log lines that name it.

The proxy sets ``current`` for each request it serves (a context variable: the request's tasks,
the relay and the disconnect watcher, inherit it); ``RequestLog`` appends it to each line the
proxy logs about the request. The id a user quotes from the SDK (a response's ``_request_id``,
an error's ``request_id``) then finds what the gateway logged about that request.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any

current: ContextVar[str | None] = ContextVar("gateway_request_id", default=None)


def new_request_id() -> str:
    """A request's id, unique: it names one request in the engine's log (vLLM adds a suffix of
    its own to an id it is given, so even a repeated one would not clash with one in flight)."""
    return f"req_{uuid.uuid4().hex}"


class RequestLog(logging.LoggerAdapter[logging.Logger]):
    """A logger whose lines end with the current request's id (if there is one)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        request_id = current.get()
        return (f"{msg} [{request_id}]" if request_id else msg), kwargs
