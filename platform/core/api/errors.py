"""The API's JSON parser and exception handler: failures DRF leaves to Django's HTML pages answer
in JSON with a status that says what went wrong.

* JSON nested deeper than Python's recursion limit: json raises RecursionError, not ValueError,
  so DRF's parser lets it escape (a 500). Here it is a 400 like any other malformed body.
* JSON holding a lone surrogate escape (``"\\ud800"`` without its pair): a string no UTF-8 text
  holds. Stored, PostgreSQL refused it (a 500); echoed in a field error (an unknown field's name,
  a choice), the response could not be encoded (a 500). Here it is a 400 naming the escape.
* A body over DATA_UPLOAD_MAX_MEMORY_SIZE: Django raises RequestDataTooBig when the body is read,
  and its handler answers an empty HTML 400. Here it is a 413 naming the limit.
* Deleting a row that protected foreign keys still point at (a model with deployments, say):
  ProtectedError, a 500. Here it is a 409 naming what still refers to it (the first
  NAMED_PER_KIND rows of each kind and a count of the rest).
* The database or Redis (the cache of sign-in counts and throttles) unreachable, or the database
  refusing for now (locked, a serialization failure; core/unavailable.py): Django's HTML 500
  page. Here it is a JSON 503 with Retry-After, logged with its traceback: the client can retry.
  So is the job broker refusing a new job (BrokerUnavailable, whose text is the detail).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import ProtectedError
from rest_framework import parsers, status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.response import Response

from core.strict_json import lone_surrogate
from core.unavailable import RETRY_AFTER_S, BrokerUnavailable, backing_service_unavailable


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser; a body nested too deeply to parse, or holding a lone surrogate, is a
    ParseError (400)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        surrogate = lone_surrogate(data)
        if surrogate is not None:
            raise ParseError(
                f"JSON parse error - a lone surrogate {surrogate} (half of a UTF-16 pair) is no text"
            )
        return data


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class BackingServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "service_unavailable"
    default_detail = "The database or cache is unavailable right now; retry later."


log = logging.getLogger(__name__)


# Rows named per kind in a 409: rows referring to one (a key's usage, say) can number thousands.
NAMED_PER_KIND = 10


def still_used(exc: ProtectedError) -> str:
    """The 409's message: what still refers to the row (the dashboard shows the same)."""
    kinds: dict[str, list[str]] = {}  # verbose_name_plural -> primary keys
    for obj in exc.protected_objects:
        kinds.setdefault(str(obj._meta.verbose_name_plural), []).append(str(obj.pk))
    used = "; ".join(f"{name} {_first_few(pks)}" for name, pks in kinds.items())
    return f"Cannot delete: still referred to by {used}. Delete those first."


def _first_few(pks: list[str]) -> str:
    """The lowest NAMED_PER_KIND keys (numeric keys in numeric order) and how many more there are."""
    ordered = sorted(pks, key=lambda p: (len(p), p))
    named = ", ".join(ordered[:NAMED_PER_KIND])
    rest = len(ordered) - NAMED_PER_KIND
    return f"{named} and {rest} more" if rest > 0 else named


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, after mapping the exceptions above onto API errors."""
    # Imported here: rest_framework.views loads DEFAULT_PARSER_CLASSES, which names this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        exc = PayloadTooLarge(f"Request body is larger than {limit} bytes.")
    elif isinstance(exc, ProtectedError):
        exc = Conflict(still_used(exc))
    elif backing_service_unavailable(exc):
        log.error("API request failed: a backing service is unavailable", exc_info=exc)
        detail = str(exc) if isinstance(exc, BrokerUnavailable) else None  # the others' are internal
        response = drf_exception_handler(BackingServiceUnavailable(detail), context)
        if response is not None:
            response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return drf_exception_handler(exc, context)
