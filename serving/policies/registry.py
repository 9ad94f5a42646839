"""The one registry of scheduling policies, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from serving.policies.base import SchedulingPolicy

P = TypeVar("P", bound=type[SchedulingPolicy])

_REGISTRY: dict[str, type[SchedulingPolicy]] = {}


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: register a policy class under `name`; a duplicate name raises ValueError."""

    def deco(cls: P) -> P:
        if name in _REGISTRY:
            raise ValueError(f"scheduling policy {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_policy(name: str, **options: Any) -> SchedulingPolicy:
    """Instantiate the policy registered as `name`; unknown names raise ValueError listing the known."""
    _load_builtin()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_policies())
        raise ValueError(f"unknown scheduling policy {name!r}; known: {known}") from None
    return cls(**options)


def available_policies() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Importing the implementation modules registers them; imported lazily to avoid cycles.
    import serving.policies.builtin  # noqa: F401
