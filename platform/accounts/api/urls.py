from __future__ import annotations

from django.urls import path

from accounts.api.views import ApiKeyViewSet, MeView, TokenView
from core.api.routers import Router

router = Router()
router.register("api-keys", ApiKeyViewSet, basename="apikey")

urlpatterns = [
    path("auth/token/", TokenView.as_view(), name="auth-token"),
    path("auth/me/", MeView.as_view(), name="auth-me"),
    *router.urls,
]
