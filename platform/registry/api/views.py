from __future__ import annotations

from rest_framework import viewsets
from rest_framework.exceptions import NotFound
from rest_framework.serializers import BaseSerializer

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
