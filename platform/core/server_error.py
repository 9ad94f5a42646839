"""The answer to an unhandled exception (Django's ``handler500``): JSON under /api/, a page elsewhere.

Django's own 500 is an HTML page for every path, so an API client (the SDK, curl piping to jq) got
``<h1>Server Error (500)</h1>`` where every other answer of the API is JSON. Pages get
``500.html``: standalone, with the icon link (without one browsers ask for /favicon.ico, a second
error in the console) and no template tags, since whatever failed (the database, static files)
may be what rendering would need. Loading it goes through the template engine all the same, which
may be what failed (a tag library that does not import, no file handle left to read it): then the
page is `FALLBACK`, as an exception here is not answered by Django at all. The exception itself is
logged by Django before this is called.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.template import loader

log = logging.getLogger(__name__)

# 500.html without its comments, for when the template engine cannot give it.
FALLBACK = (
    '<!doctype html>\n<html lang="en">\n<head><meta charset="utf-8"><link rel="icon" href="data:,">'
    "<title>Server error · LLM serving platform</title></head>\n<body><main><h1>Server error</h1>"
    '<p role="alert" id="server-error-reason">The server failed to answer this page. The failure is'
    " in the server's log; trying again may work.</p>"
    '<p><a href="/" id="back">Back to the dashboard</a></p></main></body>\n</html>\n'
)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path == "/api" or request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error: the failure is in the server's log."}, status=500)
    try:
        page = loader.get_template("500.html").render()
    except Exception:
        log.exception("The 500 page could not be rendered; answering the built-in one")
        page = FALLBACK
    return HttpResponseServerError(page)
