from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import viewsets

from inventory.api.serializers import DeviceSerializer, HostSerializer
from inventory.models import Device, Host


class HostViewSet(viewsets.ReadOnlyModelViewSet):
    """Hosts and their devices (agents register them; the API only reads)."""

    queryset = Host.objects.prefetch_related("devices").order_by("name")
    serializer_class = HostSerializer


class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    """Devices of every host; ``?host=<name>`` narrows to one host."""

    serializer_class = DeviceSerializer

    def get_queryset(self) -> QuerySet[Device]:
        devices = Device.objects.select_related("host").order_by("host__name", "index")
        host = self.request.query_params.get("host")
        return devices.filter(host__name=host) if host else devices
