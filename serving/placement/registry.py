"""The one registry of placers, by name ("cp-sat", "greedy")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from serving.placement.base import Placer
from serving.placement.inputs import PlacerConfig

P = TypeVar("P", bound=type[Placer])

_REGISTRY: dict[str, type[Placer]] = {}


def register_placer(name: str) -> Callable[[P], P]:
    """Class decorator: register a placer under `name`; a duplicate name raises ValueError."""

    def deco(cls: P) -> P:
        if name in _REGISTRY:
            raise ValueError(f"placer {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_placer(name: str, config: PlacerConfig | None = None) -> Placer:
    """Instantiate the placer registered as `name`; unknown names raise ValueError listing the known."""
    _load_builtin()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown placer {name!r}; known: {', '.join(available_placers())}") from None
    return cls(config)


def available_placers() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Importing the implementations registers them; lazily, to avoid import cycles.
    import serving.placement.cpsat
    import serving.placement.greedy  # noqa: F401
