from __future__ import annotations

from rest_framework import serializers

from inventory.models import Device, Host


class DeviceSerializer(serializers.ModelSerializer):
    host: serializers.SlugRelatedField[Host] = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Device
        fields = ["id", "host", "index", "uuid", "name", "kind", "memory_total_bytes", "nvlink_peers"]
        read_only_fields = fields


class HostSerializer(serializers.ModelSerializer):
    devices = DeviceSerializer(many=True, read_only=True)

    class Meta:
        model = Host
        fields = ["id", "name", "address", "status", "last_seen_at", "simulated", "created_at", "devices"]
        read_only_fields = fields
