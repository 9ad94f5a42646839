"""The dashboard's browser websocket routes (added to config/routing.py's browser list)."""

from __future__ import annotations

from django.urls import path

from dashboard.consumers import JobConsumer, JobsConsumer, LogConsumer, ModelConsumer, OverviewConsumer

websocket_urlpatterns = [
    path("ws/dashboard/overview/", OverviewConsumer.as_asgi()),
    path("ws/dashboard/jobs/", JobsConsumer.as_asgi()),
    path("ws/dashboard/jobs/<int:pk>/", JobConsumer.as_asgi()),
    path("ws/dashboard/models/<int:pk>/", ModelConsumer.as_asgi()),
    path("ws/dashboard/deployments/<int:pk>/logs/", LogConsumer.as_asgi()),
]
