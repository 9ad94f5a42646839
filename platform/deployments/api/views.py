from __future__ import annotations

from rest_framework import viewsets

from deployments.api.serializers import DeploymentSerializer
from deployments.models import Deployment


class DeploymentViewSet(viewsets.ModelViewSet):
    """Deployments: viewers read, admins create, change desired state/devices, delete."""

    queryset = Deployment.objects.select_related("model", "host").prefetch_related("devices").order_by("id")
    serializer_class = DeploymentSerializer
