"""`MethodNotAllowedPageMiddleware`: a page address that takes only a form's POST (/jobs/start/,
/api-keys/new/, ...) answers a visit (a GET: Enter in the address bar of a refused form's answer,
shown at that address; a bookmark) with a 405 that says so. Django's ``require_POST`` answers it
with no body, which browsers show as their own error page. The API answers its own 405s (JSON).

`ServiceUnavailableMiddleware`: a page whose view failed because the database, Redis or the job
broker cannot serve now answers 503 with Retry-After, not Django's bare "Server Error (500)".

The API and the /v1 gateway answer such failures as JSON 503s themselves (core/api/errors.py,
gateway/errors.py); this covers the HTML pages: the dashboard, sign-in (which counts failures in
the cache), the admin. What counts as "cannot serve now" is core.unavailable's rule, so a
programming error the database reports stays a 500. The page is rendered without the request's
context: that would read the session and the user, from the service that is down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from core.unavailable import RETRY_AFTER_S, backing_service_unavailable

logger = logging.getLogger(__name__)


class MethodNotAllowedPageMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or response.content or request.path_info.startswith("/api/"):
            return response
        page = render_to_string("405.html", {"allowed": response.get("Allow", "")})
        response.content = page.encode()
        response["Content-Type"] = "text/html; charset=utf-8"
        return response


class ServiceUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not backing_service_unavailable(exception):
            return None  # Django's handling: a 500, logged
        logger.error(
            "%s %s: a backing service is unavailable", request.method, request.path, exc_info=exception
        )
        page = render_to_string("503.html", {"retry_after_s": RETRY_AFTER_S})
        response = HttpResponse(page, status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
