from __future__ import annotations

from django.urls import path

from gateway.api.views import ModelLatencyView, UsageView

urlpatterns = [
    path("gateway/latency/<slug:name>/", ModelLatencyView.as_view(), name="gateway-latency"),
    path("gateway/usage/", UsageView.as_view(), name="gateway-usage"),
]
