"""URL map: REST API under /api/v1/, schema + Swagger UI, health, login, admin, the dashboard."""

from __future__ import annotations

from accounts.views import LimitedPasswordChangeView, SignOutView, admin_password_change
from dashboard.prometheus import PrometheusView
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path, re_path
from drf_spectacular.views import SpectacularAPIView

from core.api.docs import SwaggerView
from core.api.notfound import api_not_found
from core.api.root import ApiRootView
from core.server_error import server_error

api_v1: list[URLPattern | URLResolver] = [
    path("", ApiRootView.as_view(), name="api-root"),
    path("", include("accounts.api.urls")),
    path("", include("registry.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("deployments.api.urls")),
    path("", include("jobs.api.urls")),
    path("", include("agents.api.urls")),
    path("", include("planning.api.urls")),
    path("", include("gateway.api.urls")),
    path("metrics/", PrometheusView.as_view(), name="prometheus-metrics"),
]

# Sign-in, sign-out and a signed-in user's password change. Not django.contrib.auth.urls as a whole:
# its password reset pages let anyone make the server mail a reset link (SMTP to localhost:25 unless
# configured; none is), unauthenticated and unlimited, each failure a logged traceback.
accounts = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", SignOutView.as_view(), name="logout"),
    # Our pages, not the admin's (Django's default templates, headed "Django administration").
    path(
        "password_change/",
        LimitedPasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_change_done.html"),
        name="password_change_done",
    ),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/", include("core.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    re_path(r"^api/(?P<rest>.*)$", api_not_found),  # after every API route: JSON 404s under /api/
    path("accounts/", include(accounts)),
    # Before the admin's own: its password change page with the failed sign-in limits (accounts/forms.py).
    path("admin/password_change/", admin_password_change, name="admin-password-change"),
    path("admin/", admin.site.urls),
    # The chat playground page (the /v1 gateway itself is mounted in config/asgi.py).
    path("", include("gateway.urls")),
    # The operator dashboard owns the remaining paths (/, /models/, /jobs/, ...): last, so it never
    # shadows the routes above.
    path("", include("dashboard.urls")),
]

# JSON under /api/, a page elsewhere (Django's own 500 is HTML everywhere).
handler500 = server_error
