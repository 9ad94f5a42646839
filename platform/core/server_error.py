"""The answer to an unhandled exception (Django's ``handler500``): JSON under /api/, a page elsewhere.

Django's own 500 is an HTML page for every path, so an API client (the SDK, curl piping to jq) got
``<h1>Server Error (500)</h1>`` where every other answer of the API is JSON. Pages get
``500.html``: standalone, with the icon link (without one browsers ask for /favicon.ico, a second
error in the console) and no template tags, since whatever failed (the database, static files)
may be what rendering would need. The exception itself is logged by Django before this is called.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.template import loader


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path == "/api" or request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error: the failure is in the server's log."}, status=500)
    return HttpResponseServerError(loader.get_template("500.html").render())
