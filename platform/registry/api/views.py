from __future__ import annotations

from rest_framework import viewsets

from core.api.errors import Conflict
from registry import services
from registry.api.serializers import ServedModelSerializer
from registry.models import ServedModel


class ServedModelViewSet(viewsets.ModelViewSet):
    """Served models: viewers read, admins create, update and delete (409 while in use)."""

    queryset = services.served_models()
    serializer_class = ServedModelSerializer

    def perform_destroy(self, instance: ServedModel) -> None:
        try:
            services.delete_served_model(instance)
        except services.ModelInUse as exc:
            raise Conflict(str(exc)) from None
