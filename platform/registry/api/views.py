from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from core.api.schema import conflict
from registry.api.serializers import ServedModelSerializer
from registry.models import ServedModel
from registry.services import served_models


class ServedModelViewSet(viewsets.ModelViewSet):
    """Served models: viewers read, admins create, update and delete."""

    queryset = served_models()
    serializer_class = ServedModelSerializer

    def perform_update(self, serializer: BaseSerializer[ServedModel]) -> None:
        try:
            serializer.save()
        except ServedModel.DoesNotExist:  # deleted by another request since get_object() read it
            raise NotFound("No ServedModel matches the given query.") from None

    @extend_schema(
        responses={
            204: None,
            # ProtectedError of its deployments, a 409 through core.api.errors
            409: conflict(
                "Deployments still refer to the model (the detail names them): delete those first."
            ),
        }
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete a model; one that deployments (stopped ones too) still refer to is refused with
        409 naming them, until they are deleted."""
        return super().destroy(request, *args, **kwargs)
