"""Field validators for served models (shared by the model and the API)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError


def validate_power_of_two(value: int) -> None:
    """Tensor-parallel sizes split attention heads evenly: 1, 2, 4, 8, ..."""
    if value < 1 or value & (value - 1):
        raise ValidationError(f"{value} is not a power of two >= 1 (1, 2, 4, 8, ...).")


def validate_positive(value: float) -> None:
    if not value > 0:
        raise ValidationError(f"{value} must be positive.")


def validate_percentage(value: float) -> None:
    if not 0 < value <= 100:
        raise ValidationError(f"{value} must be in (0, 100].")


def validate_engine_options(value: Any) -> None:
    """Engine options are a JSON object of keyword arguments: string keys only."""
    if not isinstance(value, dict):
        raise ValidationError("Engine options must be a JSON object.")
    bad = sorted(str(key) for key in value if not isinstance(key, str) or not key.isidentifier())
    if bad:
        raise ValidationError(f"Engine option names must be identifiers: {', '.join(bad)}.")
