from __future__ import annotations

from rest_framework import serializers

from planning.models import ModelProfile, PlacementPlan


class ModelProfileSerializer(serializers.ModelSerializer):
    """A model's current profile; ``data`` holds the whole curve."""

    model = serializers.CharField(source="model.name", read_only=True)

    class Meta:
        model = ModelProfile
        fields = [
            "model",
            "backend",
            "role",
            "max_rps",
            "capped",
            "kv_capacity_bytes",
            "free_kv_bytes",
            "lendable_bytes",
            "swap_needed_bytes",
            "cost_model",
            "slo_ttft_p99_ms",
            "slo_tbt_p99_ms",
            "tensor_parallel_size",
            "data",
            "job",
            "updated_at",
        ]
        read_only_fields = fields


class PlacementPlanSerializer(serializers.ModelSerializer):
    """A place job's plan and its diff (``moves``) against the deployments it was computed on."""

    applied_by = serializers.CharField(source="applied_by.username", read_only=True, allow_null=True)

    class Meta:
        model = PlacementPlan
        fields = ["job", "plan", "moves", "fingerprint", "applied_at", "applied_by", "created_at"]
        read_only_fields = fields


class ApplyResultSerializer(serializers.Serializer):
    applied = serializers.BooleanField(help_text="false: the deployments already matched the plan")
    moves = serializers.ListField(child=serializers.DictField(), help_text="the changes made")
    detail = serializers.CharField()
