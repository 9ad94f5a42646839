"""``GET /api/v1/``: the API's index, so that the base URL `make run` prints answers with where to go."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

# name in the index -> URL name of the route; every collection of the API and the credential routes.
ENTRIES = {
    "auth-token": "auth-token",
    "auth-me": "auth-me",
    "models": "servedmodel-list",
    "hosts": "host-list",
    "devices": "device-list",
    "deployments": "deployment-list",
    "jobs": "job-list",
    "job-kinds": "job-kinds",
    "api-keys": "apikey-list",
    "profiles": "profile-list",
    "plans": "plan-list",
    "gateway-usage": "gateway-usage",
    "schema": "schema",
    "docs": "swagger-ui",
}


class ApiRootView(APIView):
    """Links to the API's collections (any signed-in user, like every other read)."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response({name: reverse(url, request=request) for name, url in ENTRIES.items()})
