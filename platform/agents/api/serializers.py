from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from agents.history import RESOLUTIONS
from agents.models import Replica
from core.serializers import refuse_non_ascii_digits

DEFAULT_WINDOW = timedelta(minutes=5)


class SinceField(serializers.Field):
    """An ISO 8601 instant (a naive one is UTC) or seconds since the epoch, in ASCII digits
    (``float()`` reads any Unicode digit)."""

    default_error_messages = {
        "invalid": "Give an ISO 8601 date-time (e.g. 2026-01-01T12:00:00Z) or seconds since the epoch."
    }

    def to_internal_value(self, data: Any) -> datetime:
        refuse_non_ascii_digits(data)
        text = str(data).strip()
        try:
            return datetime.fromtimestamp(float(text), UTC)
        except (ValueError, OverflowError, OSError):
            pass
        try:
            parsed = datetime.fromisoformat(text.replace(" ", "+"))  # '+' arrives as ' ' in a query
        except ValueError:
            self.fail("invalid")
        parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # e.g. 0001-01-01T00:00+14:00 is before datetime.min in UTC
            self.fail("invalid")

    def to_representation(self, value: datetime) -> str:
        return value.isoformat()


class SeriesQuerySerializer(serializers.Serializer):
    """Query parameters of the chart endpoints."""

    since = SinceField(required=False, help_text="start of the series; default: 5 minutes ago")
    resolution = serializers.ChoiceField(choices=RESOLUTIONS, default="auto")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        since = attrs.get("since", now - DEFAULT_WINDOW)
        if since > now:
            raise serializers.ValidationError({"since": ["must not be in the future"]})
        attrs["since"] = since
        attrs["now"] = now
        return attrs


class ReplicaSerializer(serializers.ModelSerializer):
    class Meta:
        model = Replica
        fields = ["state", "error", "restarts", "port", "base_url", "simulated", "reported_at"]
        read_only_fields = fields
