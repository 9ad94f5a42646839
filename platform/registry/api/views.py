from __future__ import annotations

from rest_framework import viewsets

from registry.api.serializers import ServedModelSerializer
from registry.services import served_models


class ServedModelViewSet(viewsets.ModelViewSet):
    """Served models: viewers read, admins create, update and delete."""

    queryset = served_models()
    serializer_class = ServedModelSerializer
