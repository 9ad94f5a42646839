from __future__ import annotations

from rest_framework import serializers

from core.serializers import StrictModelSerializer
from registry.models import ServedModel
from registry.validators import validate_engine_options


class ServedModelSerializer(StrictModelSerializer):
    """A served model. Unknown fields, non-power-of-two TP sizes and non-positive SLOs are 400s."""

    engine_options = serializers.JSONField(required=False, validators=[validate_engine_options])

    class Meta:
        model = ServedModel
        fields = [
            "id",
            "name",
            "source",
            "dtype",
            "tensor_parallel_size",
            "max_context_length",
            "slo_ttft_p99_ms",
            "slo_tbt_p99_ms",
            "slo_attainment_pct",
            "engine_options",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_source(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Give a local path or a hub id (org/name).")
        return value.strip()
