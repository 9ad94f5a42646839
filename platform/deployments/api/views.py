from __future__ import annotations

from rest_framework import viewsets
from rest_framework.exceptions import NotFound
from rest_framework.serializers import BaseSerializer

from deployments.api.serializers import DeploymentSerializer
from deployments.models import Deployment


class DeploymentViewSet(viewsets.ModelViewSet):
    """Deployments: viewers read, admins create, change desired state/devices, delete."""

    queryset = Deployment.objects.select_related("model", "host").prefetch_related("devices").order_by("id")
    serializer_class = DeploymentSerializer

    def perform_update(self, serializer: BaseSerializer[Deployment]) -> None:
        try:
            serializer.save()
        except Deployment.DoesNotExist:  # deleted by another request since get_object() read it
            raise NotFound("No Deployment matches the given query.") from None
