"""URL map: REST API under /api/v1/, schema + Swagger UI, health, login, admin, the dashboard."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core.api.notfound import api_not_found

api_v1 = [
    path("", include("accounts.api.urls")),
    path("", include("registry.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("deployments.api.urls")),
    path("", include("jobs.api.urls")),
    path("", include("agents.api.urls")),
    path("", include("planning.api.urls")),
    path("", include("gateway.api.urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/", include("core.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    re_path(r"^api/(?P<rest>.*)$", api_not_found),  # after every API route: JSON 404s under /api/
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    # The chat playground page (the /v1 gateway itself is mounted in config/asgi.py).
    path("", include("gateway.urls")),
    # The operator dashboard owns the remaining paths (/, /models/, /jobs/, ...): last, so it never
    # shadows the routes above.
    path("", include("dashboard.urls")),
]
