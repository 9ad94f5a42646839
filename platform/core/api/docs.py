"""``/api/docs/``: Swagger UI, for signed-in users like the rest of the API.

A browser that opens it signed out got DRF's bare "401 Unauthorized" page, with no way on. It now
gets a page that says so and links to the sign-in page, which brings it back here; the status and
the ``WWW-Authenticate: Token`` header stay the API's, so clients and the route checks see the same
401 as before.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.exceptions import NotAuthenticated
from rest_framework.response import Response


class SwaggerView(SpectacularSwaggerView):
    def handle_exception(self, exc: Exception) -> Any:
        if isinstance(exc, NotAuthenticated):
            sign_in = reverse("login") + "?" + urlencode({"next": self.request.get_full_path()})
            response = render(self.request, "api_docs_sign_in.html", {"sign_in": sign_in}, status=401)
            response["WWW-Authenticate"] = self.get_authenticate_header(self.request) or "Token"
            return response
        result: Response = super().handle_exception(exc)
        return result
