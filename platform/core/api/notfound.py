"""Unknown paths under /api/ answer JSON, like the rest of the API, instead of Django's HTML 404.

It also replaces Django's trailing-slash redirect there: a 301 makes clients re-send a POST as a
GET without its body, so a missing slash is a 404 that names the right path instead.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt  # it changes nothing; API clients with a token send no CSRF cookie and must see the 404
def api_not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    if not request.path_info.endswith("/"):
        try:  # the URLconf's paths are below the deployment's URL prefix (SCRIPT_NAME): path_info
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not api_not_found:
            detail = f"Not found. Use {request.path}/ (with a trailing slash)."  # as the client sends it
            return JsonResponse({"detail": detail}, status=404)
    return JsonResponse({"detail": "Not found."}, status=404)
