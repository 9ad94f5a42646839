from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from core.api.errors import Conflict
from core.api.schema import conflict
from deployments import services
from deployments.api.serializers import DeploymentSerializer
from deployments.models import Deployment


class DeploymentViewSet(viewsets.ModelViewSet):
    """Deployments: viewers read, admins create, change desired state/devices, delete (once stopped)."""

    queryset = Deployment.objects.select_related("model", "host").prefetch_related("devices").order_by("id")
    serializer_class = DeploymentSerializer

    def perform_update(self, serializer: BaseSerializer[Deployment]) -> None:
        try:
            serializer.save()
        except Deployment.DoesNotExist:  # deleted by another request since get_object() read it
            raise NotFound("No Deployment matches the given query.") from None

    @extend_schema(responses={204: None, 409: conflict("The deployment is meant to run: stop it first.")})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete a deployment whose desired state is ``stopped``; one meant to run is refused
        (409) until it is stopped, as on the dashboard."""
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance: Deployment) -> None:
        try:
            services.delete_stopped_deployment(instance)
        except services.DeploymentRunning as exc:
            raise Conflict(str(exc)) from exc
        except Deployment.DoesNotExist:  # deleted by another request since get_object() read it
            raise NotFound("No Deployment matches the given query.") from None
