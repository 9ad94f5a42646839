from __future__ import annotations

from django.urls import path

from agents.api.views import DeploymentMetricsView, HostTelemetryView

urlpatterns = [
    path("hosts/<int:pk>/telemetry/", HostTelemetryView.as_view(), name="host-telemetry"),
    path("deployments/<int:pk>/metrics/", DeploymentMetricsView.as_view(), name="deployment-metrics"),
]
