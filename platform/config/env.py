"""Typed readers for settings taken from the environment.

Each helper returns a safe local default when the variable is unset (or empty) and raises
``ImproperlyConfigured`` naming the variable and the bad value when it cannot be parsed, so a
typo in a deployment fails at start-up instead of silently falling back.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str = "") -> str:
    """A string; ``default`` when unset or empty."""
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    """A boolean spelled 1/0, true/false, yes/no or on/off (any case)."""
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """An integer, optionally bounded below."""
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be >= {minimum}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    """A float, optionally bounded below."""
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be >= {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blank items are dropped."""
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_path(name: str, default: Path) -> Path:
    """A filesystem path, made absolute."""
    value = _raw(name)
    return (Path(value) if value is not None else default).expanduser().resolve()


def env_dir(name: str, default: Path) -> Path:
    """A directory's path, made absolute. It may not exist yet (it is made when first written to),
    but the nearest of it and its parents that exists must be a directory."""
    path = env_path(name, default)
    value = _raw(name) or str(default)
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
    except OSError as error:  # a parent this process may not look into: exists() raises EACCES
        raise ImproperlyConfigured(
            f"{name}={value!r} cannot be a directory: {error.filename}: {error.strerror}"
        ) from None
    if not existing.is_dir():
        raise ImproperlyConfigured(f"{name}={value!r} cannot be a directory: {existing} is not one")
    return path


def env_url(name: str, schemes: tuple[str, ...]) -> str | None:
    """A URL whose scheme is one of ``schemes``; ``None`` when unset."""
    value = _raw(name)
    if value is None:
        return None
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme not in schemes:
        raise ImproperlyConfigured(f"{name}={value!r} must start with one of {', '.join(schemes)}://")
    return value
