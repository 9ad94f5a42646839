from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers, viewsets

from inventory.api.serializers import DeviceSerializer, HostSerializer
from inventory.models import Device, Host


class HostViewSet(viewsets.ReadOnlyModelViewSet):
    """Hosts and their devices (agents register them; the API only reads)."""

    queryset = Host.objects.prefetch_related("devices").order_by("name")
    serializer_class = HostSerializer


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter(
                "host", OpenApiTypes.STR, description="only the devices of the host of this name"
            )
        ],
        responses={
            200: DeviceSerializer(many=True),
            400: inline_serializer(
                "DeviceFilterError", {"host": serializers.ListField(child=serializers.CharField())}
            ),
        },
    )
)
class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    """Devices of every host; ``?host=<name>`` narrows to one host."""

    serializer_class = DeviceSerializer

    def get_queryset(self) -> QuerySet[Device]:
        devices = Device.objects.select_related("host").order_by("host__name", "index")
        host = self.request.query_params.get("host")
        if host and "\x00" in host:
            # PostgreSQL text cannot hold NUL: the lookup raised DataError (a 500) rather than find
            # nothing. The message is the one a NUL in a body's host name gets (NameRelatedField).
            raise serializers.ValidationError({"host": ["Null characters are not allowed."]})
        return devices.filter(host__name=host) if host else devices
