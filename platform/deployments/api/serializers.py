from __future__ import annotations

from typing import Any

from inventory.models import Device, Host
from registry.models import ServedModel
from rest_framework import serializers

from core.serializers import NameRelatedField, PrimaryKeyRelatedField, StrictModelSerializer
from deployments import services
from deployments.models import Deployment


class DeviceIdField(PrimaryKeyRelatedField):
    """A device id: an integer (or its digits as a string), never a float the database would
    truncate to another device's id."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("incorrect_type", data_type=type(data).__name__)
        return super().to_internal_value(data)


class DeploymentSerializer(StrictModelSerializer):
    """A model on devices of one host. ``model`` and ``host`` are names; ``devices`` are device ids."""

    model = NameRelatedField(slug_field="name", queryset=ServedModel.objects.all())
    host = NameRelatedField(slug_field="name", queryset=Host.objects.all())
    devices = DeviceIdField(many=True, queryset=Device.objects.all())
    converged = serializers.BooleanField(read_only=True)

    class Meta:
        model = Deployment
        fields = [
            "id",
            "model",
            "host",
            "devices",
            "desired_state",
            "observed_state",
            "observed_message",
            "observed_at",
            "converged",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "id",
            "observed_state",
            "observed_message",
            "observed_at",
            "converged",
            "created_at",
            "updated_at",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        instance: Deployment | None = self.instance
        if instance is not None:
            fixed: dict[str, list[str]] = {
                name: ["A deployment's model and host cannot change; create a new deployment."]
                for name in ("model", "host")
                if name in attrs and attrs[name] != getattr(instance, name)
            }
            if fixed:
                raise serializers.ValidationError(fixed)
        return attrs

    def create(self, validated_data: dict[str, Any]) -> Deployment:
        try:
            return services.create_deployment(
                validated_data["model"],
                validated_data["host"],
                validated_data["devices"],
                validated_data.get("desired_state", "running"),
            )
        except services.PlacementError as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc

    def update(self, instance: Deployment, validated_data: dict[str, Any]) -> Deployment:
        try:
            return services.update_deployment(
                instance,
                devices=validated_data.get("devices"),
                desired_state=validated_data.get("desired_state"),
            )
        except services.PlacementError as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
