"""The answer to an unhandled exception (Django's ``handler500``): JSON under /api/, a page elsewhere.

Django's own 500 is an HTML page for every path, so an API client (the SDK, curl piping to jq) got
``<h1>Server Error (500)</h1>`` where every other answer of the API is JSON. Pages get ``PAGE``,
with the icon link (without one browsers ask for /favicon.ico, a second error in the console). It
is a constant, not a template: whatever failed may be what rendering needs (the template engine
itself, a tag library that does not import, no file handle left to read a template), and an
exception here is not answered by Django at all. The exception itself is logged by Django before
this is called.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <link rel="icon" href="data:,">
  <title>Server error · LLM serving platform</title>
</head>
<body style="font-family: system-ui, sans-serif; margin: 2rem;">
  <main>
    <h1>Server error</h1>
    <p role="alert" id="server-error-reason">The server failed to answer this page.
      The failure is in the server's log; trying again may work.</p>
    <p><a href="/" id="back">Back to the dashboard</a></p>
  </main>
</body>
</html>
"""


def server_error(request: HttpRequest) -> HttpResponse:
    # path_info: the path below the deployment's URL prefix (SCRIPT_NAME), which ``path`` includes.
    if request.path_info == "/api" or request.path_info.startswith("/api/"):
        return JsonResponse({"detail": "Server error: the failure is in the server's log."}, status=500)
    return HttpResponseServerError(PAGE)
